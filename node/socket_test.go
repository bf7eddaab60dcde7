package node

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestSocketErrorsNameThePath: a missing socket, a socket nobody listens
// on and a file that is not a socket each fail the first call at once with
// a sentence that names the path, through the client gcagent builds.
func TestSocketErrorsNameThePath(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "nope.sock")
	refused := filepath.Join(dir, "refused.sock")
	ln, err := net.Listen("unix", refused)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close() // the socket file stays, nobody listens: ECONNREFUSED
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, path, want string }{
		{"missing", missing, "containerd socket " + missing + " does not exist"},
		{"refused", refused, "connection refused on " + refused + " (is containerd running?)"},
		{"not a socket", plain, "containerd socket " + plain + " is not a socket"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl, err := client.New(tc.path, ClientOpts()...)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), "k8s.io"), 20*time.Second)
			defer cancel()
			start := time.Now()
			_, err = cl.Version(ctx)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Version: %v, want %q", err, tc.want)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("failed after %s: want at once, not after a dial timeout", took)
			}
			conn, err := DialCRI(tc.path)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := runtime.NewRuntimeServiceClient(conn).Version(ctx, &runtime.VersionRequest{}); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("CRI Version: %v, want %q", err, tc.want)
			}
			var se *SocketError
			if _, err := DialSocket(ctx, tc.path); !errors.As(err, &se) || se.Error() != tc.want && !strings.HasPrefix(se.Error(), tc.want) {
				t.Errorf("DialSocket: %v, want %q", err, tc.want)
			}
		})
	}
}
