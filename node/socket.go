package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// SocketError says why containerd's unix socket cannot be dialed, naming
// the path: missing, not a socket, refused, or not permitted.
type SocketError struct {
	Path string
	Err  error // the dial's error
}

func (e *SocketError) Error() string {
	switch {
	case errors.Is(e.Err, fs.ErrNotExist):
		return fmt.Sprintf("containerd socket %s does not exist", e.Path)
	case errors.Is(e.Err, syscall.ECONNREFUSED):
		if fi, err := os.Stat(e.Path); err == nil && fi.Mode()&fs.ModeSocket == 0 {
			return fmt.Sprintf("containerd socket %s is not a socket (%s)", e.Path, fi.Mode().Type())
		}
		return fmt.Sprintf("connection refused on %s (is containerd running?)", e.Path)
	case errors.Is(e.Err, fs.ErrPermission):
		return fmt.Sprintf("permission denied on containerd socket %s (run as root or the socket's group)", e.Path)
	}
	return fmt.Sprintf("containerd socket %s: %v", e.Path, e.Err)
}

func (e *SocketError) Unwrap() error { return e.Err }

// DialSocket dials containerd's unix socket once. Unlike containerd's own
// dialer it does not wait for a missing socket to appear: the caller's
// retry decides when to try again, and the error names the cause
// (*SocketError).
func DialSocket(ctx context.Context, address string) (net.Conn, error) {
	path := strings.TrimPrefix(address, "unix://")
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		var se *SocketError
		if errors.As(err, &se) {
			return nil, err
		}
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EACCES) ||
			errors.Is(err, syscall.ENOTSOCK) {
			return nil, &SocketError{Path: path, Err: err}
		}
		return nil, err
	}
	return c, nil
}

// socketDial is a gRPC connection's dialer and the interceptors that put
// its last failure in place of gRPC's wrapping ("connection error: desc =
// transport: Error while dialing: ...") in a call's Unavailable status.
type socketDial struct {
	last atomic.Pointer[SocketError] // nil after a dial that worked
}

func (s *socketDial) dial(ctx context.Context, address string) (net.Conn, error) {
	c, err := DialSocket(ctx, address)
	var se *SocketError
	switch {
	case err == nil:
		s.last.Store(nil)
	case errors.As(err, &se):
		s.last.Store(se)
	}
	return c, err
}

// plain returns err with the socket's failure as its message when the call
// failed because the socket could not be dialed; the code stays Unavailable.
func (s *socketDial) plain(err error) error {
	if err == nil || status.Code(err) != codes.Unavailable {
		return err
	}
	if se := s.last.Load(); se != nil {
		return status.Error(codes.Unavailable, se.Error())
	}
	return err
}

func (s *socketDial) options() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithContextDialer(s.dial),
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
			invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return s.plain(invoker(ctx, method, req, reply, cc, opts...))
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
			streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			st, err := streamer(ctx, desc, cc, method, opts...)
			return st, s.plain(err)
		}),
	}
}
