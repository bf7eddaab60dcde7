package natsbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/wait"
	"github.com/nats-io/nats.go"
)

// fakeHandler is a Handler that records calls; gcBlock, when set, holds GC
// until it is closed.
type fakeHandler struct {
	node     string
	calls    sync.Map // verb -> *atomic.Int32
	explains chan string
	gcBlock  chan struct{}
	gcIn     chan struct{} // receives once per GC call that started
	running  atomic.Int32
	overlap  atomic.Bool
}

var _ Handler = (*fakeHandler)(nil)

func newFakeHandler(node string) *fakeHandler {
	return &fakeHandler{node: node, explains: make(chan string, 16), gcIn: make(chan struct{}, 16)}
}

func (h *fakeHandler) count(verb string) int {
	v, _ := h.calls.LoadOrStore(verb, new(atomic.Int32))
	return int(v.(*atomic.Int32).Load())
}

func (h *fakeHandler) inc(verb string) {
	v, _ := h.calls.LoadOrStore(verb, new(atomic.Int32))
	v.(*atomic.Int32).Add(1)
}

func (h *fakeHandler) Status(context.Context) (any, error) {
	h.inc(VerbStatus)
	return map[string]any{"node": h.node, "images": 3}, nil
}

func (h *fakeHandler) Plan(context.Context) (any, error) {
	h.inc(VerbPlan)
	return map[string]any{"delete": []string{"sha256:aa"}}, nil
}

func (h *fakeHandler) Explain(_ context.Context, image string) (any, error) {
	h.inc(VerbExplain)
	h.explains <- image
	if image == "unknown:1" {
		return nil, RequesterError(errors.New(`image "unknown:1" is not known to this node`))
	}
	return map[string]any{"image": image, "decision": "keep", "reason": "in-use"}, nil
}

func (h *fakeHandler) GC(ctx context.Context) (any, error) {
	h.inc(VerbGC)
	if h.running.Add(1) > 1 {
		h.overlap.Store(true)
	}
	defer h.running.Add(-1)
	h.gcIn <- struct{}{}
	if h.gcBlock != nil {
		select {
		case <-h.gcBlock:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return map[string]any{"deleted": 2}, nil
}

// serveControl runs ServeControl for node until the test ends and waits until it answers.
func serveControl(t *testing.T, nc *nats.Conn, h Handler, opts ControlOptions) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	before := nc.NumSubscriptions()
	go func() { done <- ServeControl(ctx, nc, h, opts) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ServeControl: %v", err)
		}
	})
	// Subscriptions are live once a round trip to the server has passed.
	wait.Until(t, 5*time.Second, "control subscriptions", func() bool {
		_ = nc.Flush()
		return nc.NumSubscriptions() >= before+2
	})
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// rawRequest sends data on subject and decodes the reply.
func rawRequest(t *testing.T, nc *nats.Conn, subject string, data []byte) ControlReply {
	t.Helper()
	m, err := nc.Request(subject, data, 5*time.Second)
	if err != nil {
		t.Fatalf("request %s: %v", subject, err)
	}
	var r ControlReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		t.Fatalf("reply %q: %v", m.Data, err)
	}
	return r
}

func ctx5(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestControlVerbs(t *testing.T) {
	s := runServer(t, -1, "", false)
	agentConn, callerConn := connect(t, s.ClientURL()), connect(t, s.ClientURL())
	h := newFakeHandler("n1")
	logs := &logBuffer{}
	serveControl(t, agentConn, h, ControlOptions{Cluster: "c1", Node: "n1", AllowRemoteGC: true, Logger: logs.logger()})

	cases := []struct {
		verb     string
		args     any
		wantData string
	}{
		{VerbStatus, nil, `{"images":3,"node":"n1"}`},
		{VerbPlan, nil, `{"delete":["sha256:aa"]}`},
		{VerbExplain, ExplainArgs{Image: "example.test/app:1"}, `{"decision":"keep","image":"example.test/app:1","reason":"in-use"}`},
		{VerbGC, nil, `{"deleted":2}`},
	}
	for _, tc := range cases {
		t.Run(tc.verb, func(t *testing.T) {
			r, err := Request(ctx5(t), callerConn, "c1", "n1", tc.verb, RequestOptions{ID: "req-" + tc.verb, Args: tc.args})
			if err != nil {
				t.Fatal(err)
			}
			if !r.OK || r.Error != "" || r.ID != "req-"+tc.verb || r.Node != "n1" || r.Verb != tc.verb {
				t.Fatalf("reply %+v", r)
			}
			if string(r.Data) != tc.wantData {
				t.Errorf("data %s, want %s", r.Data, tc.wantData)
			}
			if n := h.count(tc.verb); n != 1 {
				t.Errorf("%s called %d times", tc.verb, n)
			}
		})
	}
	// A handler error is an error reply with the handler's text.
	r, err := Request(ctx5(t), callerConn, "c1", "n1", VerbExplain, RequestOptions{ID: "x", Args: ExplainArgs{Image: "unknown:1"}})
	if err != nil {
		t.Fatal(err)
	}
	if r.OK || !strings.Contains(r.Error, "not known to this node") || r.Data != nil {
		t.Errorf("explain of an unknown image: %+v", r)
	}
	// Every request is logged with its id, verb and the caller's connection name.
	lines := logs.lines(t, "control request")
	if len(lines) != 5 {
		t.Fatalf("%d control request log lines, want 5", len(lines))
	}
	for _, l := range lines {
		if l["component"] != "control" || l["caller"] != callerConn.Opts.Name || l["request_id"] == "" || l["verb"] == "" {
			t.Errorf("log line %v", l)
		}
	}
}

func TestControlRejectsBadRequests(t *testing.T) {
	s := runServer(t, -1, "", false)
	agentConn, callerConn := connect(t, s.ClientURL()), connect(t, s.ClientURL())
	h := newFakeHandler("n1")
	logs := &logBuffer{}
	serveControl(t, agentConn, h, ControlOptions{Cluster: "c1", Node: "n1", AllowRemoteGC: true, Logger: logs.logger()})

	huge := `{"id":"big","args":{"pad":"` + strings.Repeat("x", MaxRequestBytes) + `"}}`
	cases := []struct {
		name, subject, data, wantErr, wantID string
	}{
		{"malformed JSON", "gcagent.v1.ctl.c1.n1.gc", `{"id": "m1", `, "malformed request", ""},
		{"not an object", "gcagent.v1.ctl.c1.n1.gc", `["gc"]`, "malformed request", ""},
		{"unknown field", "gcagent.v1.ctl.c1.n1.gc", `{"id":"u1","force":true}`, "malformed request", ""},
		{"trailing data", "gcagent.v1.ctl.c1.n1.gc", `{"id":"t1"} {"id":"t2"}`, "trailing data", ""},
		{"missing id", "gcagent.v1.ctl.c1.n1.gc", `{"args":{}}`, "no id", ""},
		{"empty payload", "gcagent.v1.ctl.c1.n1.gc", ``, "malformed request", ""},
		{"id too long", "gcagent.v1.ctl.c1.n1.gc", `{"id":"` + strings.Repeat("i", MaxRequestIDBytes+1) + `"}`, "at most", ""},
		{"oversized", "gcagent.v1.ctl.c1.n1.gc", huge, "more than the 65536 allowed", ""},
		{"unknown verb", "gcagent.v1.ctl.c1.n1.delete-everything", `{"id":"v1"}`, `unknown verb "delete-everything"`, "v1"},
		{"multi-token verb", "gcagent.v1.ctl.c1.n1.gc.now", `{"id":"v2"}`, `unknown verb "gc.now"`, "v2"},
		{"args on gc", "gcagent.v1.ctl.c1.n1.gc", `{"id":"a1","args":{"all":true}}`, "gc takes no args", "a1"},
		{"explain without image", "gcagent.v1.ctl.c1.n1.explain", `{"id":"e1","args":{}}`, "explain needs args", "e1"},
		{"explain with bad args", "gcagent.v1.ctl.c1.n1.explain", `{"id":"e2","args":"app"}`, "malformed explain args", "e2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := rawRequest(t, callerConn, tc.subject, []byte(tc.data))
			if r.OK || !strings.Contains(r.Error, tc.wantErr) || r.Node != "n1" || r.ID != tc.wantID || r.Data != nil {
				t.Errorf("reply %+v, want an error containing %q with id %q", r, tc.wantErr, tc.wantID)
			}
		})
	}
	for _, v := range Verbs {
		if n := h.count(v); n != 0 {
			t.Errorf("a rejected request called %s %d times", v, n)
		}
	}
	if n := len(logs.lines(t, "control request")); n != len(cases) {
		t.Errorf("%d log lines for %d rejected requests", n, len(cases))
	}
}

func TestControlGCRefusedWithoutAllow(t *testing.T) {
	s := runServer(t, -1, "", false)
	agentConn, callerConn := connect(t, s.ClientURL()), connect(t, s.ClientURL())
	h := newFakeHandler("n1")
	serveControl(t, agentConn, h, ControlOptions{Cluster: "c1", Node: "n1"})
	r, err := Request(ctx5(t), callerConn, "c1", "n1", VerbGC, RequestOptions{ID: "g1"})
	if err != nil {
		t.Fatal(err)
	}
	if r.OK || r.Error != ErrRemoteGCDisabled.Error() || r.ID != "g1" {
		t.Errorf("gc without --allow-remote-gc: %+v", r)
	}
	if n := h.count(VerbGC); n != 0 {
		t.Errorf("GC called %d times", n)
	}
	// Reading is still allowed.
	if r, err := Request(ctx5(t), callerConn, "c1", "n1", VerbStatus, RequestOptions{}); err != nil || !r.OK || r.ID == "" {
		t.Errorf("status: %+v %v", r, err)
	}
}

func TestControlGCNeverConcurrent(t *testing.T) {
	s := runServer(t, -1, "", false)
	agentConn, callerConn := connect(t, s.ClientURL()), connect(t, s.ClientURL())
	h := newFakeHandler("n1")
	h.gcBlock = make(chan struct{})
	serveControl(t, agentConn, h, ControlOptions{Cluster: "c1", Node: "n1", AllowRemoteGC: true})

	first := make(chan ControlReply, 1)
	go func() {
		r, err := Request(context.Background(), callerConn, "c1", "n1", VerbGC, RequestOptions{ID: "first"})
		if err != nil {
			t.Error(err)
		}
		first <- r
	}()
	<-h.gcIn // the first pass runs
	// A second gc, to the node or to all, is refused while the first runs;
	// reads are still answered.
	for _, node := range []string{"n1", AllNodes} {
		var r ControlReply
		var err error
		if node == AllNodes {
			var rs []ControlReply
			rs, err = RequestAll(ctx5(t), callerConn, "c1", VerbGC, 1, RequestOptions{ID: "second-all"})
			if len(rs) == 1 {
				r = rs[0]
			}
		} else {
			r, err = Request(ctx5(t), callerConn, "c1", node, VerbGC, RequestOptions{ID: "second"})
		}
		if err != nil || r.OK || !strings.Contains(r.Error, "busy") {
			t.Errorf("second gc via %s: %+v %v", node, r, err)
		}
	}
	if r, err := Request(ctx5(t), callerConn, "c1", "n1", VerbStatus, RequestOptions{}); err != nil || !r.OK {
		t.Errorf("status during gc: %+v %v", r, err)
	}
	close(h.gcBlock)
	if r := <-first; !r.OK || r.ID != "first" {
		t.Errorf("first gc: %+v", r)
	}
	if n := h.count(VerbGC); n != 1 || h.overlap.Load() {
		t.Errorf("GC called %d times, overlap %v", n, h.overlap.Load())
	}
	// Once it is done, the next one runs.
	if r, err := Request(ctx5(t), callerConn, "c1", "n1", VerbGC, RequestOptions{ID: "third"}); err != nil || !r.OK {
		t.Errorf("gc after the first ended: %+v %v", r, err)
	}
}

func TestControlAllReachesEveryNode(t *testing.T) {
	s := runServer(t, -1, "", false)
	callerConn := connect(t, s.ClientURL())
	nodes := []string{"n1", "n2", "n3"}
	handlers := map[string]*fakeHandler{}
	for _, n := range nodes {
		h := newFakeHandler(n)
		handlers[n] = h
		serveControl(t, connect(t, s.ClientURL()), h, ControlOptions{Cluster: "c1", Node: n})
	}
	// Another cluster's node must not answer.
	other := newFakeHandler("x1")
	serveControl(t, connect(t, s.ClientURL()), other, ControlOptions{Cluster: "c2", Node: "x1"})

	replies, err := RequestAll(ctx5(t), callerConn, "c1", VerbStatus, len(nodes), RequestOptions{ID: "all-1"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, r := range replies {
		if !r.OK || r.ID != "all-1" || r.Verb != VerbStatus {
			t.Errorf("reply %+v", r)
		}
		got[r.Node]++
	}
	for _, n := range nodes {
		if got[n] != 1 || handlers[n].count(VerbStatus) != 1 {
			t.Errorf("node %s: %d replies, %d calls", n, got[n], handlers[n].count(VerbStatus))
		}
	}
	if other.count(VerbStatus) != 0 {
		t.Errorf("a node of another cluster answered")
	}
	// Nothing more arrives: each node answered once.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	more, _ := RequestAll(ctx, callerConn, "c1", VerbStatus, 0, RequestOptions{ID: "all-2"})
	if len(more) != len(nodes) {
		t.Errorf("second broadcast: %d replies, want %d", len(more), len(nodes))
	}
	// A request to one node reaches only that node.
	if _, err := Request(ctx5(t), callerConn, "c1", "n2", VerbPlan, RequestOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		want := 0
		if n == "n2" {
			want = 1
		}
		if c := handlers[n].count(VerbPlan); c != want {
			t.Errorf("node %s plan calls %d, want %d", n, c, want)
		}
	}
}

func TestControlNoResponders(t *testing.T) {
	s := runServer(t, -1, "", false)
	nc := connect(t, s.ClientURL())
	_, err := Request(ctx5(t), nc, "c1", "nobody", VerbStatus, RequestOptions{})
	if !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("request to a node that does not exist: %v, want no responders", err)
	}
}

// TestControlAllStopsWhenQuiet: RequestAll returns once no reply came for
// Quiet after the last, and says when nobody subscribes at all.
func TestControlAllStopsWhenQuiet(t *testing.T) {
	s := runServer(t, -1, "", false)
	nc := connect(t, s.ClientURL())
	if _, err := RequestAll(ctx5(t), nc, "c1", VerbStatus, 0, RequestOptions{Quiet: 100 * time.Millisecond}); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("nobody serves c1: %v, want no responders", err)
	}
	for _, n := range []string{"n1", "n2"} {
		serveControl(t, connect(t, s.ClientURL()), newFakeHandler(n), ControlOptions{Cluster: "c1", Node: n})
	}
	start := time.Now()
	replies, err := RequestAll(ctx5(t), nc, "c1", VerbStatus, 0, RequestOptions{Quiet: 200 * time.Millisecond})
	if err != nil || len(replies) != 2 {
		t.Fatalf("RequestAll: %d replies, %v; want 2", len(replies), err)
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("RequestAll took %s: it waited for the context, not the quiet period", took)
	}
}

// TestControlTyposAreNotAgentErrors: an unknown verb or image is logged at
// info; only the agent's own failures are errors.
func TestControlTyposAreNotAgentErrors(t *testing.T) {
	s := runServer(t, -1, "", false)
	var logs logBuffer
	serveControl(t, connect(t, s.ClientURL()), newFakeHandler("n1"), ControlOptions{Cluster: "c1", Node: "n1", Logger: logs.logger()})
	nc := connect(t, s.ClientURL())
	if r, err := Request(ctx5(t), nc, "c1", "n1", VerbExplain, RequestOptions{Args: ExplainArgs{Image: "unknown:1"}}); err != nil || r.OK {
		t.Fatalf("explain unknown:1: %+v %v", r, err)
	}
	if r, err := Request(ctx5(t), nc, "c1", "n1", "statsu", RequestOptions{}); err != nil || r.OK {
		t.Fatalf("verb statsu: %+v %v", r, err)
	}
	var lines []map[string]any
	wait.For(t, 5*time.Second, func() string {
		if lines = logs.lines(t, "control request"); len(lines) < 2 {
			return fmt.Sprintf("%d request lines logged, want 2", len(lines))
		}
		return ""
	})
	for _, l := range lines {
		if l["level"] != "info" {
			t.Errorf("logged at %v: %v", l["level"], l)
		}
	}
}

func TestControlNeedsNode(t *testing.T) {
	if err := ServeControl(context.Background(), nil, newFakeHandler(""), ControlOptions{}); err == nil {
		t.Error("ServeControl without a node name succeeded")
	}
}
