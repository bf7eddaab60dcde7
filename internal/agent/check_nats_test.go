package agent

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gcagent/gcagent/natsbus"
)

// TestCheckNATSEmbeddedNotListening: the agent runs its embedded server
// in process, but its address is taken, so it recorded no URL for local
// tools. The nats line asks the agent at --metrics-address and WARNs with
// what it says (the address and the error), and says the keep list is
// known; with no agent answering there it says none runs, and what list
// a start would have from the server's own store. On d7dd547 it said OK,
// "started by run", "read from the embedded server at start".
func TestCheckNATSEmbeddedNotListening(t *testing.T) {
	readyz := "ok\nnats: embedded NATS server cannot listen on 127.0.0.1:4222 since 2026-11-26T12:00:00Z " +
		"(listen tcp 127.0.0.1:4222: bind: address already in use); retrying; it runs in process: GC, events and the fleet keep list go on; local tools (gcagent watch, ctl) cannot reach it meanwhile\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, readyz)
	}))
	defer srv.Close()
	ctx := context.Background()
	cfg := DefaultConfig()
	cfg.StateDir, cfg.MetricsAddress = t.TempDir(), strings.TrimPrefix(srv.URL, "http://")
	if _, _, err := natsbus.EnsureLocalNkey(cfg.StateDir); err != nil {
		t.Fatal(err)
	}
	r := checkNATS(ctx, cfg)
	if r.Status != CheckWarn || !strings.Contains(r.Detail, "cannot listen on 127.0.0.1:4222") || !strings.Contains(r.Detail, "address already in use") ||
		!strings.Contains(r.Detail, "fleet keep list: known") || strings.Contains(r.Detail, "at start") {
		t.Errorf("%s %s: want WARN with the address, the error and the keep list known", r.Status, r.Detail)
	}
	t.Logf("%s nats: %s", r.Status, r.Detail)

	cfg.MetricsAddress = "127.0.0.1:" + fmt.Sprint(freePort(t)) // no agent
	r = checkNATS(ctx, cfg)
	if r.Status != CheckOK || !strings.Contains(r.Detail, "no agent runs") || !strings.Contains(r.Detail, "known empty at start, image deletes do not wait") {
		t.Errorf("%s %s: want OK, no agent, the store holds no list", r.Status, r.Detail)
	}
	t.Logf("%s nats: %s", r.Status, r.Detail)
}
