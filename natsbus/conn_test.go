package natsbus

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/wait"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

func TestConnOptionsValidate(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	base := ConnOptions{URL: "nats://127.0.0.1:4222", Node: "n"}
	with := func(f func(*ConnOptions)) ConnOptions { o := base; f(&o); return o }
	for _, tc := range []struct {
		name string
		opts ConnOptions
		ok   bool
	}{
		{"minimal", base, true},
		{"no url", with(func(o *ConnOptions) { o.URL = "" }), false},
		{"no node", with(func(o *ConnOptions) { o.Node = "" }), false},
		{"creds file", with(func(o *ConnOptions) { o.CredsFile = file }), true},
		{"missing creds file", with(func(o *ConnOptions) { o.CredsFile = missing }), false},
		{"nkey and token", with(func(o *ConnOptions) { o.NkeyFile = file; o.Token = "t" }), false},
		{"user and password", with(func(o *ConnOptions) { o.User = "u"; o.Password = "p" }), true},
		{"password without user", with(func(o *ConnOptions) { o.Password = "p" }), false},
		{"mtls", with(func(o *ConnOptions) { o.TLSCA = file; o.TLSCert = file; o.TLSKey = file }), true},
		{"cert without key", with(func(o *ConnOptions) { o.TLSCert = file }), false},
		{"missing CA", with(func(o *ConnOptions) { o.TLSCA = missing }), false},
		{"max below min", with(func(o *ConnOptions) { o.ReconnectMin = time.Second; o.ReconnectMax = time.Millisecond }), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.opts.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
	if _, err := Connect(ConnOptions{Node: "n"}); err == nil {
		t.Fatal("Connect must refuse invalid options")
	}
}

func TestReconnectDelay(t *testing.T) {
	lo, hi := 250*time.Millisecond, 20*time.Second
	f := reconnectDelay(lo, hi)
	for _, tc := range []struct {
		attempts int
		ceiling  time.Duration
	}{{0, lo}, {1, lo}, {2, 2 * lo}, {3, 4 * lo}, {7, 16 * time.Second}, {8, hi}, {100, hi}, {1 << 30, hi}} {
		for range 50 {
			if d := f(tc.attempts); d < tc.ceiling/2 || d > tc.ceiling {
				t.Fatalf("delay after %d attempts = %s, want in [%s, %s]", tc.attempts, d, tc.ceiling/2, tc.ceiling)
			}
		}
	}
}

func TestConnectWaitsForServer(t *testing.T) {
	port := freePort(t)
	nc := connect(t, "nats://127.0.0.1:"+strconv.Itoa(port))
	if nc.IsConnected() {
		t.Fatal("connected to nothing")
	}
	runServer(t, port, "", false)
	wait.Until(t, 5*time.Second, "the connection to come up once the server does", nc.IsConnected)
	if got, want := nc.Opts.Name, "gcagent/default/node-1"; got != want {
		t.Errorf("connection name %q, want %q", got, want)
	}
	if nc.Opts.MaxReconnect != -1 || !nc.Opts.RetryOnFailedConnect || nc.Opts.ReconnectBufSize != DefaultReconnectBufSize ||
		nc.Opts.PingInterval != DefaultPingInterval || !nc.Opts.IgnoreAuthErrorAbort {
		t.Errorf("connection options %+v do not match the never-give-up profile", nc.Opts)
	}
}

func TestConnectAuth(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	seedFile := filepath.Join(t.TempDir(), "node.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		server server.Options
		conn   ConnOptions
	}{
		{"user/password", server.Options{Username: "u", Password: "p"}, ConnOptions{User: "u", Password: "p"}},
		{"token", server.Options{Authorization: "s3cret"}, ConnOptions{Token: "s3cret"}},
		{"nkey", server.Options{Nkeys: []*server.NkeyUser{{Nkey: pub}}}, ConnOptions{NkeyFile: seedFile}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			so := tc.server
			so.Host, so.Port, so.NoLog, so.NoSigs = "127.0.0.1", -1, true, true
			s, err := server.NewServer(&so)
			if err != nil {
				t.Fatal(err)
			}
			go s.Start()
			if !s.ReadyForConnections(5 * time.Second) {
				t.Fatal("server not ready")
			}
			t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
			co := tc.conn
			co.URL, co.Node = s.ClientURL(), "node-1"
			nc, err := Connect(co)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			wait.Until(t, 5*time.Second, "an authenticated connection", nc.IsConnected)
		})
	}
}
