package main

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
)

// TestUsageErrors: every bad flag, value or variable is a usage error
// (exit status 2) whose one line names it, and a typo names the nearest
// known name; nothing is started.
func TestUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args, env []string
		want      string
	}{
		{nil, nil, "--nats-url is required"},
		{[]string{"--nats-ur", "nats://x"}, nil, "unknown flag: --nats-ur (did you mean --nats-url?)"},
		{[]string{"--nats-url", "nats://x", "--release-after=-1s"}, nil, "invalid --release-after -1s"},
		{[]string{"--nats-url", "nats://x", "--kinds", "pods,foo"}, nil, `invalid --kinds "foo"`},
		{[]string{"--nats-url", "nats://x", "--kubeconfig", "/nonexistent/kubeconfig"}, nil, "--kubeconfig /nonexistent/kubeconfig: stat"},
		{[]string{"--nats-url", "nats://x"}, []string{"GCAGENT_CLUSTER_RELEASE_AFTR=1h"},
			"unknown variable GCAGENT_CLUSTER_RELEASE_AFTR (did you mean GCAGENT_CLUSTER_RELEASE_AFTER?)"},
		{nil, []string{"GCAGENT_CLUSTER_NATS_URL=nats://x", "GCAGENT_CLUSTER_HEARTBEAT=soon"}, `invalid GCAGENT_CLUSTER_HEARTBEAT "soon"`},
		{[]string{"extra"}, nil, `unknown command "extra"`},
	} {
		err := execute(context.Background(), c.args, c.env, io.Discard, io.Discard)
		var ue usageError
		if !errors.As(err, &ue) {
			t.Errorf("%v %v: %v, want a usage error", c.args, c.env, err)
			continue
		}
		if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v %v: %q, want one line with %q", c.args, c.env, err, c.want)
		}
	}
}
