package natsbus

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// runServer starts a nats-server on 127.0.0.1:port (-1: any free port), with
// JetStream stored in storeDir when jetStream is set; it is shut down at the
// end of the test.
func runServer(t *testing.T, port int, storeDir string, jetStream bool) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: port, JetStream: jetStream, StoreDir: storeDir, NoLog: true, NoSigs: true,
	})
	if err != nil {
		t.Fatalf("nats-server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// deadURL returns a loopback URL where nothing listens.
func deadURL(t *testing.T) string { return "nats://127.0.0.1:" + strconv.Itoa(freePort(t)) }

// connect returns a never-give-up connection with fast reconnects, closed at the end of the test.
func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := Connect(ConnOptions{URL: url, Node: "node-1", ReconnectMin: 20 * time.Millisecond, ReconnectMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// newPublisher returns a Publisher for cluster "c1", node "node-1" on stateDir, closed at the end of the test.
func newPublisher(t *testing.T, nc *nats.Conn, stateDir string, opts PublisherOptions) *Publisher {
	t.Helper()
	opts.Cluster, opts.Node, opts.StateDir = "c1", "node-1", stateDir
	p, err := NewPublisher(nc, opts)
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// action returns the i-th test action; its id is actionID(i).
func action(i int) Action {
	return Action{Kind: "image", Action: "removed", Subject: fmt.Sprintf("sha256:%064d", i), Key: fmt.Sprintf("k-%d", i),
		Data: map[string]any{"bytes": i}}
}

func actionID(i int) string {
	return EventID("c1", "node-1", "image", "removed", fmt.Sprintf("k-%d", i))
}

// streamMsgs returns every message in the events stream, in stream order.
func streamMsgs(t *testing.T, nc *nats.Conn) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, DefaultStream)
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("get msg %d: %v", seq, err)
		}
		out = append(out, m)
	}
	return out
}

// streamCount returns how many messages the events stream holds (0 when it does not exist yet).
func streamCount(nc *nats.Conn) uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		return 0
	}
	s, err := js.Stream(ctx, DefaultStream)
	if err != nil {
		return 0
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0
	}
	return info.State.Msgs
}

// assertExactlyOnce checks that the stream holds each of want exactly once,
// nothing else, and that every message's headers match its CloudEvent.
func assertExactlyOnce(t *testing.T, nc *nats.Conn, want []string) {
	t.Helper()
	msgs := streamMsgs(t, nc)
	seen := map[string]int{}
	for _, m := range msgs {
		var ev CloudEvent
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatalf("seq %d: payload is not a CloudEvent: %v", m.Sequence, err)
		}
		if got := m.Header.Get(nats.MsgIdHdr); got != ev.ID {
			t.Errorf("seq %d: Nats-Msg-Id %q, CloudEvent id %q", m.Sequence, got, ev.ID)
		}
		if m.Header.Get(HeaderContentType) != ContentType || m.Header.Get(HeaderSchema) != Schema || m.Header.Get(HeaderNode) != "node-1" {
			t.Errorf("seq %d: headers %v", m.Sequence, m.Header)
		}
		if m.Subject != "gcagent.v1.evt.c1.node-1.image.removed" {
			t.Errorf("seq %d: subject %q", m.Sequence, m.Subject)
		}
		seen[ev.ID]++
	}
	for _, id := range want {
		if seen[id] != 1 {
			t.Errorf("event %s stored %d times, want exactly once", id, seen[id])
		}
		delete(seen, id)
	}
	for id, n := range seen {
		t.Errorf("unexpected event %s stored %d times", id, n)
	}
	if len(msgs) != len(want) {
		t.Errorf("stream holds %d messages, want %d", len(msgs), len(want))
	}
}

// logBuffer is a goroutine-safe log sink.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines returns the logged JSON lines whose message is msg.
func (b *logBuffer) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, l := range bytes.Split(b.buf.Bytes(), []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if m["message"] == msg {
			out = append(out, m)
		}
	}
	return out
}

func (b *logBuffer) logger() zerolog.Logger { return zerolog.New(b) }

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// ackProxy is a loopback TCP proxy to a NATS server that can swallow
// everything the server sends (so publishes are stored but their acks are
// lost), swallow only the JetStream acks of one stream sequence (that one
// event's ack is lost, the others arrive), and cut every connection (an
// outage as the client sees it).
type ackProxy struct {
	ln       net.Listener
	target   string
	dropAcks atomic.Bool
	// dropAckSeq, when not 0, is the stream sequence whose acks (the first
	// one and the duplicate acks of every retry) never reach the client.
	dropAckSeq atomic.Uint64
	mu         sync.Mutex
	conns      []net.Conn
}

func startProxy(t *testing.T, target string) *ackProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &ackProxy{ln: ln, target: target}
	go p.accept()
	t.Cleanup(func() { ln.Close(); p.cut() })
	return p
}

func (p *ackProxy) url() string { return "nats://" + p.ln.Addr().String() }

func (p *ackProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(s, c); s.Close() }()
		go func() {
			r := bufio.NewReaderSize(s, 32<<10)
			for {
				frame, err := readFrame(r)
				if len(frame) > 0 && !p.dropAcks.Load() && !p.isDroppedAck(frame) {
					if _, werr := c.Write(frame); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			c.Close()
		}()
	}
}

// readFrame reads one server-to-client protocol frame: a control line, or a
// MSG/HMSG line with its payload.
func readFrame(r *bufio.Reader) ([]byte, error) {
	line, err := r.ReadBytes('\n')
	if err != nil {
		return line, err
	}
	f := strings.Fields(string(line))
	if len(f) < 2 || (f[0] != "MSG" && f[0] != "HMSG") {
		return line, nil
	}
	n, err := strconv.Atoi(f[len(f)-1]) // the total size is the last field of both
	if err != nil {
		return line, fmt.Errorf("proxy: bad frame %q: %w", line, err)
	}
	payload := make([]byte, n+2) // and its \r\n
	_, err = io.ReadFull(r, payload)
	return append(line, payload...), err
}

// isDroppedAck tells whether frame is a JetStream ack (a first or a
// duplicate one) of the stream sequence dropAckSeq.
func (p *ackProxy) isDroppedAck(frame []byte) bool {
	seq := p.dropAckSeq.Load()
	if seq == 0 || !bytes.HasPrefix(frame, []byte("MSG ")) {
		return false
	}
	_, payload, _ := bytes.Cut(frame, []byte("\r\n"))
	var ack struct {
		Stream string `json:"stream"`
		Seq    uint64 `json:"seq"`
	}
	return json.Unmarshal(bytes.TrimSuffix(payload, []byte("\r\n")), &ack) == nil && ack.Stream == DefaultStream && ack.Seq == seq
}

// cut closes every proxied connection; new ones are accepted as before.
func (p *ackProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}
