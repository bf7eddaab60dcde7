package node

import (
	"encoding/json"
	"maps"
	"slices"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/typeurl/v2"
	"github.com/gcagent/gcagent/internal/testenv"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"
)

// wholeAnnotations is specAnnotations by a decode of the whole spec.
func wholeAnnotations(doc []byte) map[string]string {
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if json.Unmarshal(doc, &spec) != nil {
		return nil
	}
	return spec.Annotations
}

// wholeImageRefs is criImageRefs by a decode of the whole metadata.
func wholeImageRefs(doc []byte) (string, []string) {
	var m criMetadata
	if json.Unmarshal(doc, &m) != nil {
		return "", nil
	}
	return criRefs(m)
}

func criRefs(m criMetadata) (string, []string) {
	var vols []string
	for _, mnt := range m.Metadata.Config.Mounts {
		if mnt.Image != nil && mnt.Image.Image != "" {
			vols = append(vols, mnt.Image.Image)
		}
	}
	return m.Metadata.ImageRef, vols
}

func jsonFieldSeeds(t testing.TB) [][]byte {
	spec, err := typeurl.MarshalAny(&specs.Spec{Version: specs.Version,
		Process:     &specs.Process{Args: []string{"sh", "-c", `echo "}{" '\"annotations\"'`}, Env: []string{"A=1"}},
		Annotations: map[string]string{annSandboxID: "sb1", annSandboxUID: "uid"},
		Linux:       &specs.Linux{Seccomp: &specs.LinuxSeccomp{Syscalls: []specs.LinuxSyscall{{Names: []string{"read"}, Action: specs.ActAllow}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return [][]byte{
		spec.GetValue(),
		[]byte(`{}`), []byte(` { "annotations" : { "a" : "b" } } `), []byte(`{"Annotations":{"a":"b"}}`),
		[]byte(`{"annotations":{"a":"1"},"annotations":{"b":"2"}}`), []byte(`{"x":{"annotations":{"a":"b"}}}`),
		[]byte(`{"\u0061nnotations":{"a":"b"}}`), []byte(`{"annotations":null}`), []byte(`{"annotations":{"a":1}}`),
		[]byte(`{"a":[1,{"b":"]}"}],"annotations":{"k":"v\"}"}}`), []byte(`{"annotations":{"a":"b"}`), []byte(`[]`), []byte(`"x"`),
		[]byte(`{"Metadata":{"ImageRef":"sha256:1","Config":{"mounts":[{"image":{"image":"vol:1"}},{"host_path":"/x"}]}}}`),
		[]byte(`{"Version":"v1","Metadata":{"imageref":"sha256:2","config":{"Mounts":[{"Image":{"Image":"v"}}]}}}`),
		[]byte(`{"Metadata":{"ImageRef":5}}`), []byte(`{"Metadata":null}`), []byte(`{"Metadata":{"Config":null}}`),
		// Runs of backslashes before a quote: even ones end the string.
		[]byte(`{"a\\":"\\\"}","annotations":{"k\\\\":"v\\"}}`), []byte(`{"\\\"annotations":{"a":"b"},"annotations":{"c":"d"}}`),
	}
}

// TestJSONFieldAgrees: on the seeds, the annotations and CRI image refs
// found by scanning are those a decode of the whole document finds.
func TestJSONFieldAgrees(t *testing.T) {
	for _, doc := range jsonFieldSeeds(t) {
		checkJSONField(t, doc)
	}
	if raw, ok := jsonField([]byte(`{"a":1,"annotations":{"k":"v"},"b":[2]}`), "annotations"); !ok || string(raw) != `{"k":"v"}` {
		t.Errorf("jsonField = %q %v", raw, ok)
	}
	if _, ok := jsonField([]byte(`{"annotations":{},"ANNOTATIONS":{}}`), "annotations"); ok {
		t.Error("a key held twice (in any case) scanned as once")
	}
}

func checkJSONField(t *testing.T, doc []byte) {
	t.Helper()
	ann := specAnnotations(containers.Container{Spec: &anypb.Any{Value: doc}})
	id, vols := criImageRefs(containers.Container{Extensions: map[string]typeurl.Any{extCRIContainerMetadata: &anypb.Any{Value: doc}}})
	if !json.Valid(doc) {
		return
	}
	if want := wholeAnnotations(doc); !maps.Equal(ann, want) || (ann == nil) != (want == nil) {
		t.Errorf("%s: annotations %v, whole decode %v", doc, ann, want)
	}
	if wid, wvols := wholeImageRefs(doc); id != wid || !slices.Equal(vols, wvols) {
		t.Errorf("%s: image refs %q %v, whole decode %q %v", doc, id, vols, wid, wvols)
	}
}

// BenchmarkCRIRecord reads what a listing reads of a CRI container record
// of a real one's size (testenv's seed: a 10 KiB spec, 2.8 KiB of CRI
// metadata): the spec's annotations and the metadata's image refs.
func BenchmarkCRIRecord(b *testing.B) {
	c, err := testenv.Seed{Images: 1}.SeedContainer(0)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(c.Spec.GetValue()) + len(c.Extensions[extCRIContainerMetadata].GetValue())))
	for b.Loop() {
		if specAnnotations(c)[annSandboxID] == "" {
			b.Fatal("no sandbox annotation")
		}
		if id, _ := criImageRefs(c); id == "" {
			b.Fatal("no image ref")
		}
	}
}
