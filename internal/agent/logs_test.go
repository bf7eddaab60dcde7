package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/logs"
	"github.com/gcagent/gcagent/node"
	"github.com/gcagent/gcagent/projection"
	"github.com/gcagent/gcagent/schema"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// logsCRI counts ListPodSandbox calls; with hang it answers none, as a
// CRI plugin stuck behind a lock does, until the caller gives up.
type logsCRI struct {
	runtimeapi.RuntimeServiceClient
	hang  bool
	calls atomic.Int64
}

func (f *logsCRI) ListPodSandbox(ctx context.Context, _ *runtimeapi.ListPodSandboxRequest, _ ...grpc.CallOption) (*runtimeapi.ListPodSandboxResponse, error) {
	f.calls.Add(1)
	if f.hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return &runtimeapi.ListPodSandboxResponse{}, nil
}

var _ deletion.Journal = (*logsJournal)(nil)

// logsJournal is a deletion.Journal in memory: completed intents become
// published actions.
type logsJournal struct {
	mu        sync.Mutex
	seq       uint64
	published []schema.Action
}

func (j *logsJournal) Intend(ns string, a schema.Action, id *deletion.Identity) (deletion.Intent, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.seq++
	d, err := json.Marshal(a.Data)
	return deletion.Intent{Seq: j.seq, Namespace: ns, Kind: a.Kind, Action: a.Action, Subject: a.Subject, Key: a.Key, Data: d, Identity: id}, err
}

func (j *logsJournal) Complete(in deletion.Intent, d any) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.published = append(j.published, schema.Action{Kind: in.Kind, Action: in.Action, Subject: in.Subject, Key: in.Key, Data: d})
	return nil
}

func (j *logsJournal) Abandon(deletion.Intent) error       { return nil }
func (j *logsJournal) Pending() ([]deletion.Intent, error) { return nil, nil }
func (j *logsJournal) Publish(schema.Action) error         { return nil }

// logsGone is the node's Gone check for logs.
type logsGone struct{}

func (logsGone) Gone(_ context.Context, in deletion.Intent) (bool, error) {
	_, err := os.Lstat(in.Subject)
	return os.IsNotExist(err), nil
}

// TestLogsPassAsksCRINothingPerPodDir: finding 7. N orphaned pod dirs, the
// projection synced and seeing no sandbox of their uids (and one of a live
// pod, whose sandbox's log dir shows the pod log dir is the watched
// containerd's), the agent wired as run wires it: one pass removes them all without asking CRI, and a CRI
// that hangs does not stall the pass (it cost a call per dir, twice, 5 s
// each while CRI hung).
func TestLogsPassAsksCRINothingPerPodDir(t *testing.T) {
	const dirs = 5
	for _, hang := range []bool{false, true} {
		t.Run(fmt.Sprintf("hang=%v", hang), func(t *testing.T) {
			base := t.TempDir()
			cfg := DefaultConfig()
			cfg.LogDir, cfg.PodLogDir, cfg.PodLogGrace = filepath.Join(base, "containers"), filepath.Join(base, "pods"), 0
			for _, d := range []string{cfg.LogDir, cfg.PodLogDir} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			var paths []string
			for i := range dirs {
				p := filepath.Join(cfg.PodLogDir, fmt.Sprintf("ns_pod%d_uid-%d", i, i))
				if err := os.MkdirAll(filepath.Join(p, "app"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(p, "app", "0.log"), []byte("x\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				paths = append(paths, p)
			}
			// A live pod whose sandbox's log dir is there: the pod log dir
			// holds the watched containerd's pods.
			liveDir := filepath.Join(cfg.PodLogDir, "ns_live_uid-9")
			if err := os.MkdirAll(liveDir, 0o755); err != nil {
				t.Fatal(err)
			}
			live, err := projection.NewSpaces(projection.SpacesOptions{})
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			sandbox := events.ContainerUpserted{ID: "sb9", CRIKind: projection.KindSandbox, PodUID: "uid-9", PodName: "live", PodNamespace: "ns",
				SandboxID: "sb9", LogDir: liveDir}
			live.Apply(events.Scoped{Namespace: events.CRINamespace, Event: events.Listing{At: now, Containers: []events.ContainerUpserted{sandbox}}},
				events.Scoped{Event: events.Round{At: now, Namespaces: []string{events.CRINamespace}}})
			cri := &logsCRI{hang: hang}
			j := &logsJournal{}
			d, err := deletion.New(deletion.Deps{Journal: j, Checker: logsGone{}}, deletion.Options{RetryGap: time.Nanosecond})
			if err != nil {
				t.Fatal(err)
			}
			a := &agent{cfg: cfg, log: zerolog.Nop(), reg: prometheus.NewRegistry(), live: live, pub: gc.Discard{},
				runtime: node.NewRuntime(nil, cri, nil), deletes: d, clock: clock.New(nil)}
			if err := a.setupLogs(); err != nil {
				t.Fatal(err)
			}

			// One CRI timeout (5 s) bounds the pass; the goroutine never
			// touches t, so a stalled one cannot outlive the test's checks.
			done := make(chan error, 1)
			go func() { _, err := a.logs.Clean(context.Background()); done <- err }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("pass: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("the pass is still running after one CRI timeout: %d ListPodSandbox calls so far", cri.calls.Load())
			}
			if n := cri.calls.Load(); n != 0 {
				t.Errorf("%d ListPodSandbox calls for one pass over %d dead pod dirs, want none (the projection answers)", n, dirs)
			}
			for _, p := range paths {
				if _, err := os.Lstat(p); !os.IsNotExist(err) {
					t.Errorf("%s: not removed (%v)", p, err)
				}
			}
			// Each removal is committed through the agent's delete transactions.
			j.mu.Lock()
			defer j.mu.Unlock()
			if len(j.published) != dirs {
				t.Errorf("%d events stored, want %d log.removed: %+v", len(j.published), dirs, j.published)
			}
			for _, a := range j.published {
				if a.Kind != schema.KindLog || a.Action != schema.ActionRemoved {
					t.Errorf("stored %s.%s %q, want log.removed", a.Kind, a.Action, a.Subject)
				}
			}
		})
	}
}

// TestPodStateFromProjection: a pod's state is the projection's: alive
// while a sandbox of its uid exists, gone since its last sandbox went,
// unknown when never seen.
func TestPodStateFromProjection(t *testing.T) {
	gone := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s := projection.New()
	s.Pods["alive"] = &projection.Pod{UID: "alive", Sandboxes: map[string]struct{}{"sb1": {}}, GoneAt: gone}
	s.Pods["gone"] = &projection.Pod{UID: "gone", Sandboxes: map[string]struct{}{}, GoneAt: gone}
	for _, tc := range []struct {
		uid          string
		alive, known bool
		since        time.Time
	}{
		{"alive", true, true, time.Time{}},
		{"gone", false, true, gone},
		{"never", false, false, time.Time{}},
	} {
		alive, since, known := logs.StaticState(s, "").PodState(tc.uid)
		if alive != tc.alive || known != tc.known || !since.Equal(tc.since) {
			t.Errorf("PodState(%q) = %v %v %v, want %v %v %v", tc.uid, alive, since, known, tc.alive, tc.since, tc.known)
		}
	}
}
