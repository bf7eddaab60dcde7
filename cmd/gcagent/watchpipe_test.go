package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/wait"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/nats-io/nats-server/v2/server"
)

// TestWatchIntoAPipe: watch whose output is not a terminal prints the
// table once, then only what changes, one line each (d7dd547 reprinted the
// whole table every --refresh); --once prints the table with the actions
// stored within --since and exits by itself (d7dd547 had no --once).
func TestWatchIntoAPipe(t *testing.T) {
	s := startTestNATS(t)
	p := newTestPublisher(t, s.ClientURL(), "c1", "n1")
	publish := func(subject, key string) {
		t.Helper()
		if err := p.Publish(natsbus.Action{Kind: "image", Action: "removed", Subject: subject, Key: key}); err != nil {
			t.Fatal(err)
		}
		wait.For(t, 10*time.Second, func() string {
			if p.Depth() > 0 {
				return "publisher not drained"
			}
			return ""
		})
	}
	publish("sha256:before", "before")

	var once, onceErr syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := execute(ctx, []string{"watch", "--nats-url", s.ClientURL(), "--cluster", "c1", "--since", "10m", "--once"}, nil, &once, &onceErr); err != nil {
		t.Fatalf("watch --once: %v (%s)", err, onceErr.String())
	}
	if ctx.Err() != nil || strings.Count(once.String(), "gcagent fleet") != 1 || !strings.Contains(once.String(), "sha256:before") {
		t.Errorf("watch --once printed (deadline %v):\n%s", ctx.Err(), once.String())
	}

	wctx, stop := context.WithCancel(context.Background())
	var out, errOut syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- execute(wctx, []string{"watch", "--nats-url", s.ClientURL(), "--cluster", "c1", "--since", "10m", "--refresh", "50ms"}, nil, &out, &errOut)
	}()
	wait.For(t, 10*time.Second, func() string {
		if !strings.Contains(out.String(), "sha256:before") {
			return "no table yet: " + out.String()
		}
		return ""
	})
	publish("sha256:after", "after")
	wait.For(t, 10*time.Second, func() string {
		if !strings.Contains(out.String(), "sha256:after") {
			return "the new action is not printed: " + out.String()
		}
		return ""
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("watch: %v (%s)", err, errOut.String())
	}
	text := out.String()
	t.Logf("watch into a pipe printed:\n%s", text)
	if n := strings.Count(text, "gcagent fleet"); n != 1 {
		t.Errorf("the table printed %d times, want once then changes:\n%s", n, text)
	}
	last := text[strings.Index(text, "counted of"):]
	if !strings.Contains(last, "image.removed  sha256:after") || strings.Count(text, "sha256:before") != 1 || strings.Contains(text, "\x1b[") {
		t.Errorf("after the table, want only the new action, one line, no escapes:\n%s", text)
	}
}

// TestWatchSaysTheLocalAgentIsStarting: on the local agent's embedded
// server before the agent made its streams (its first seconds), watch says
// the agent is starting and waits for them, where d7dd547 said "stream not
// found ... retrying" for the status and fell back to live events only.
func TestWatchSaysTheLocalAgentIsStarting(t *testing.T) {
	dir := t.TempDir()
	seed, pub, err := natsbus.EnsureLocalNkey(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The agent's embedded server: JetStream, the local nkey user.
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
		Nkeys: []*server.NkeyUser{{Nkey: pub}}})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if err := natsbus.WriteLocalURL(dir, s.ClientURL()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errOut syncBuffer
	done := make(chan error, 1)
	go func() { done <- execute(ctx, []string{"watch", "--state-dir", dir, "--once"}, nil, &out, &errOut) }()
	wait.For(t, 20*time.Second, func() string {
		if !strings.Contains(errOut.String(), "the local agent is starting: its event stream GCAGENT_EVT is not made yet") {
			select {
			case err := <-done:
				t.Fatalf("watch ended: %v\n%s\n%s", err, out.String(), errOut.String())
			default:
			}
			return "not said: " + errOut.String() + out.String()
		}
		return ""
	})
	if strings.Contains(errOut.String(), "stream not found") || strings.Contains(errOut.String(), "live events only") {
		t.Errorf("stderr: %s", errOut.String())
	}
	// The agent makes its streams: watch goes on and prints the fleet.
	nc, err := natsbus.Connect(natsbus.ConnOptions{URL: s.ClientURL(), Cluster: "default", Node: "n1", NkeyFile: seed})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	p, err := natsbus.NewPublisher(nc, natsbus.PublisherOptions{Cluster: "default", Node: "n1", StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Publish(natsbus.Action{Kind: "image", Action: "removed", Subject: "sha256:first", Key: "first"}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil || !strings.Contains(out.String(), "gcagent fleet") {
		t.Fatalf("watch --once after the streams came: %v\n%s\n%s", err, out.String(), errOut.String())
	}
}
