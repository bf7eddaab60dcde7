package node

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/containerd/v2/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
)

// CallTimeout bounds every unary call to containerd and CRI that its
// caller did not bound: a hung daemon fails calls instead of stalling GC.
// (Only a test build can shorten it: calltimeout_testhooks.go.)
const CallTimeout = 30 * time.Second

// maxCRIMessage lets CRI listings of tens of thousands of containers in
// (a gRPC client takes 4 MiB by default, the kubelet's 16 MiB; 30,000
// containers are 22-24 MiB). containerd sends at most 16 MiB unless its
// [grpc] max_send_message_size is raised.
const maxCRIMessage = 256 << 20

// DeadlineInterceptor gives every unary call without a deadline one of d.
// Streams (the event subscription) are left alone.
func DeadlineInterceptor(d time.Duration) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, d)
			defer cancel()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// reconnectMax bounds gRPC's own wait between dials of a socket that
// failed: containerd that comes back is followed within it (the Source
// also resets it before each of its attempts).
const reconnectMax = 5 * time.Second

// ClientOpts are the containerd client options gcagent uses: every unary
// call bounded by CallTimeout; a missing or refused socket fails calls at
// once with an error naming the path (DialSocket) instead of after a
// timeout.
func ClientOpts() []client.Opt {
	sd := &socketDial{}
	return []client.Opt{client.WithExtraDialOpts(append(sd.options(),
		grpc.WithChainUnaryInterceptor(DeadlineInterceptor(callTimeout)),
		grpc.WithConnectParams(connectParams()),
	))}
}

func connectParams() grpc.ConnectParams {
	b := backoff.DefaultConfig
	b.MaxDelay = reconnectMax
	return grpc.ConnectParams{Backoff: b, MinConnectTimeout: 10 * time.Second}
}

// DialCRI opens a gRPC connection for CRI clients on containerd's socket,
// with every unary call bounded by CallTimeout and room for large
// listings. It does not dial until the first call; a missing or refused
// socket fails calls at once, naming the path.
func DialCRI(address string) (*grpc.ClientConn, error) {
	sd := &socketDial{}
	conn, err := grpc.NewClient("unix://"+address, append(sd.options(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(DeadlineInterceptor(callTimeout)), grpc.WithConnectParams(connectParams()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxCRIMessage)))...)
	if err != nil {
		return nil, fmt.Errorf("cri %s: %w", address, err)
	}
	return conn, nil
}
