package deploy

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestOneVersion: the release in the VERSION file is the tag `make image`
// writes (and stamps into both binaries it holds, gcagent and
// gcagent-cluster, built alike), the chart's appVersion (its version
// without the "v"), the chart's default image tag, and the manifest's image.
func TestOneVersion(t *testing.T) {
	b, err := os.ReadFile("../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	v := strings.TrimSpace(string(b))
	if !regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`).MatchString(v) {
		t.Fatalf("VERSION %q: want vMAJOR.MINOR.PATCH[-PRE]", v)
	}

	b, err = os.ReadFile("helm/gcagent/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ch struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &ch); err != nil {
		t.Fatal(err)
	}
	if ch.AppVersion != v || "v"+ch.Version != v {
		t.Errorf("Chart.yaml version %q appVersion %q, want %q and %q (VERSION)", ch.Version, ch.AppVersion, strings.TrimPrefix(v, "v"), v)
	}
	b, err = os.ReadFile("helm/gcagent/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^  tag: ""$`).Match(b) {
		t.Error(`values.yaml: image.tag must default to "" (the chart's appVersion)`)
	}

	m, err := DecodeManifest(ManifestYAML)
	if err != nil {
		t.Fatal(err)
	}
	c, err := m.AgentContainer()
	if err != nil {
		t.Fatal(err)
	}
	if _, tag, _ := strings.Cut(c.Image, ":"); tag != v {
		t.Errorf("the manifest's image %s, want the tag %s (VERSION; `make manifest` regenerates it)", c.Image, v)
	}

	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make: the image tag `make image` writes is not checked")
	}
	cmd := exec.Command("make", "-n", "image")
	cmd.Dir = ".."
	for _, e := range os.Environ() { // an inherited VERSION would override the file
		if !strings.HasPrefix(e, "VERSION=") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n image: %v\n%s", err, out)
	}
	for _, want := range []string{"internal/version.Version=" + v + " ", "mkimage -binary bin/gcagent-static -version " + v + " ",
		"-cluster-binary bin/gcagent-cluster-static "} {
		if !strings.Contains(string(out), want) {
			t.Errorf("make image does not run with %q:\n%s", want, out)
		}
	}
	// Both binaries static, stripped and stamped with the release alike.
	for _, bin := range []string{"bin/gcagent-static ./cmd/gcagent\n", "bin/gcagent-cluster-static ./cmd/gcagent-cluster\n"} {
		if !regexp.MustCompile(`(?m)^CGO_ENABLED=0 \S+ build .*-ldflags "-s -w [^"]*internal/version\.Version=` + regexp.QuoteMeta(v) + ` [^"]*" -o ` + regexp.QuoteMeta(bin)).Match(out) {
			t.Errorf("make image does not build %q static, stripped, with version %s:\n%s", strings.TrimSpace(bin), v, out)
		}
	}
}
