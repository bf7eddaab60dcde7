package testenv

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/wait"
	"github.com/nats-io/nats-server/v2/server"
)

// Link forwards TCP from a loopback port to a target until Cut; Restore
// listens on the same port again. It stands for the WAN link between a
// site's leaf node and the hub.
type Link struct {
	t      testing.TB
	Addr   string
	target string
	mu     sync.Mutex
	ln     net.Listener
	conns  []net.Conn
}

// NewLink starts forwarding a free loopback port to target; it is cut when the test ends.
func NewLink(t testing.TB, target string) *Link {
	t.Helper()
	l := &Link{t: t, Addr: FreeAddr(t), target: target}
	l.Restore()
	t.Cleanup(l.Cut)
	return l
}

// Restore listens again and forwards every new connection.
func (l *Link) Restore() {
	l.t.Helper()
	var ln net.Listener
	wait.Until(l.t, 10*time.Second, "the link's port free again", func() bool {
		var err error
		ln, err = net.Listen("tcp", l.Addr)
		return err == nil
	})
	l.mu.Lock()
	l.ln = ln
	l.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", l.target)
			if err != nil {
				c.Close()
				continue
			}
			l.mu.Lock()
			l.conns = append(l.conns, c, up)
			l.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
}

// Cut closes the listener and every forwarded connection.
func (l *Link) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ln != nil {
		l.ln.Close()
		l.ln = nil
	}
	for _, c := range l.conns {
		c.Close()
	}
	l.conns = nil
}

// HubDomain and LeafDomain are the JetStream domains of StartHubAndLeaf.
const (
	HubDomain  = "hub"
	LeafDomain = "site1"
)

// StartHubAndLeaf starts a hub server running JetStream domain HubDomain
// and a leaf server with a JetStream domain of its own (LeafDomain),
// connected to the hub through link: the fleet topology of a site whose
// nodes talk to a local leaf that extends the central domain. The hub
// does not advertise its leaf port, so the leaf reaches it only through
// link. Both stop when the test ends.
func StartHubAndLeaf(t testing.TB) (hub, leaf *server.Server, link *Link) {
	t.Helper()
	leafAddr := FreeAddr(t)
	host, port, _ := net.SplitHostPort(leafAddr)
	var leafPort int
	fmt.Sscan(port, &leafPort)
	hub = startServer(t, &server.Options{ServerName: "hub-0", Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, JetStreamDomain: HubDomain, StoreDir: t.TempDir(),
		LeafNode: server.LeafNodeOpts{Host: host, Port: leafPort, NoAdvertise: true}})
	link = NewLink(t, leafAddr)
	u, _ := url.Parse("nats-leaf://" + link.Addr)
	leaf = startServer(t, &server.Options{ServerName: "leaf-" + LeafDomain, Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, JetStreamDomain: LeafDomain, StoreDir: t.TempDir(),
		LeafNode: server.LeafNodeOpts{ReconnectInterval: 100 * time.Millisecond,
			Remotes: []*server.RemoteLeafOpts{{URLs: []*url.URL{u}}}}})
	wait.Until(t, 10*time.Second, "the leaf connected to the hub", func() bool { return leaf.NumLeafNodes() == 1 })
	return hub, leaf, link
}

func startServer(t testing.TB, o *server.Options) *server.Server {
	t.Helper()
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatalf("nats server %s: %v", o.ServerName, err)
	}
	go s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatalf("nats server %s not ready", o.ServerName)
	}
	return s
}
