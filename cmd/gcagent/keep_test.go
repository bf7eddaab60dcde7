package main

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestCtlKeep: add creates the bucket and the cluster's key, takes flags
// after the pattern, ls shows every list, rm removes, and bad input is a
// usage error.
func TestCtlKeep(t *testing.T) {
	s := startTestNATS(t)
	run := func(args ...string) (string, error) {
		out, errOut, err := runCLI(context.Background(), nil, append([]string{"ctl", "keep"}, args...)...)
		return out + errOut, err
	}
	url := "--nats-url=" + s.ClientURL()
	if out, err := run("add", "registry.example/app:*", "--cluster", "prod", url); err != nil || !strings.Contains(out, "cluster prod") {
		t.Fatalf("add: %v\n%s", err, out)
	}
	if out, err := run("add", "base.example/*", "--all-clusters", url); err != nil || !strings.Contains(out, "all clusters") {
		t.Fatalf("add all: %v\n%s", err, out)
	}
	out, err := run("ls", url)
	if err != nil || !strings.Contains(out, "prod     registry.example/app:*") || !strings.Contains(out, "*        base.example/*") {
		t.Fatalf("ls: %v\n%s", err, out)
	}
	if out, err := run("rm", "registry.example/app:*", "--cluster=prod", url); err != nil || !strings.Contains(out, "0 patterns left") {
		t.Fatalf("rm: %v\n%s", err, out)
	}
	if _, err := run("rm", "registry.example/app:*", "--cluster=prod", url); err == nil {
		t.Fatal("rm of a pattern not in the list succeeded")
	}
	for _, bad := range [][]string{{"add", "[x", url}, {"add", url}, {"frob", url}, {"add", "a", "--replicas=0", url}} {
		var ue usageError
		if _, err := run(bad...); !errors.As(err, &ue) {
			t.Errorf("%v: %v, want a usage error", bad, err)
		}
	}
}
