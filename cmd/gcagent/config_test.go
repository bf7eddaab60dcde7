package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/agent"
)

func TestParseRun(t *testing.T) {
	file := filepath.Join(t.TempDir(), "gcagent.conf")
	if err := os.WriteFile(file, []byte("# fleet defaults\nimage-gc-high-threshold = 90\nimage-gc-low-threshold = 70\nkeep-image = \"registry.test/*\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		args    []string
		env     map[string]string
		check   func(agent.Config) bool
		wantErr string
	}{
		{name: "defaults", check: func(c agent.Config) bool {
			return c.ImageGCHighThreshold == 85 && c.ImageGCLowThreshold == 80 && c.MinimumImageTTL == 2*time.Minute &&
				c.MaxDeadPerContainer == 1 && c.MaxDeadContainers == -1 && c.PruneContainers == "native"
		}},
		{name: "kubelet flags", args: []string{"--image-gc-high-threshold=95", "--image-gc-low-threshold", "90", "--minimum-image-ttl-duration=30s", "--keep-image=a/*", "--keep-image=b:*"},
			check: func(c agent.Config) bool {
				return c.ImageGCHighThreshold == 95 && c.ImageGCLowThreshold == 90 && c.MinimumImageTTL == 30*time.Second && len(c.KeepImages) == 2
			}},
		{name: "env", env: map[string]string{"GCAGENT_PRUNE_CONTAINERS": "all", "GCAGENT_NODE_NAME": "n1"},
			check: func(c agent.Config) bool { return c.PruneContainers == "all" && c.NodeName == "n1" }},
		{name: "flag beats env", args: []string{"--prune-containers=off"}, env: map[string]string{"GCAGENT_PRUNE_CONTAINERS": "all"},
			check: func(c agent.Config) bool { return c.PruneContainers == "off" }},
		{name: "file, env beats file", args: []string{"--config", file}, env: map[string]string{"GCAGENT_IMAGE_GC_LOW_THRESHOLD": "75"},
			check: func(c agent.Config) bool {
				return c.ImageGCHighThreshold == 90 && c.ImageGCLowThreshold == 75 && len(c.KeepImages) == 1
			}},
		{name: "high over 100", args: []string{"--image-gc-high-threshold=101"}, wantErr: "invalid --image-gc-high-threshold 101"},
		{name: "low above high", args: []string{"--image-gc-low-threshold=90"}, wantErr: "must not exceed --image-gc-high-threshold 85"},
		{name: "negative ttl", args: []string{"--minimum-container-ttl-duration=-1s"}, wantErr: "must not be negative"},
		{name: "zero uncollected grace", args: []string{"--uncollected-exit-grace=0s"}, wantErr: "invalid --uncollected-exit-grace 0s: must be positive"},
		{name: "max age not above min age", args: []string{"--image-maximum-gc-age=1m"}, wantErr: "must be greater than --minimum-image-ttl-duration"},
		{name: "bad prune mode", args: []string{"--prune-containers=some"}, wantErr: `invalid --prune-containers "some"`},
		{name: "bad keep glob", args: []string{"--keep-image=[x"}, wantErr: "invalid --keep-image"},
		{name: "bad duration", args: []string{"--pod-log-grace=soon"}, wantErr: `invalid argument "soon" for "--pod-log-grace" flag: want a duration with a unit`},
		{name: "bad duration in env", env: map[string]string{"GCAGENT_POD_LOG_GRACE": "5"}, wantErr: `GCAGENT_POD_LOG_GRACE: invalid value "5" for --pod-log-grace: want a duration with a unit`},
		{name: "percent with a sign", args: []string{"--image-gc-high-threshold=90%", "--image-gc-low-threshold", "70%"},
			check: func(c agent.Config) bool { return c.ImageGCHighThreshold == 90 && c.ImageGCLowThreshold == 70 }},
		{name: "bad percent", args: []string{"--image-gc-high-threshold=high"}, wantErr: "want a whole percent from 0 to 100"},
		{name: "bad count", args: []string{"--maximum-dead-containers=many"}, wantErr: "want a whole number (-1 = no limit)"},
		{name: "bad bool", args: []string{"--dry-run=maybe"}, wantErr: "want true or false"},
		{name: "unknown flag", args: []string{"--frobnicate"}, wantErr: "unknown flag --frobnicate"},
		{name: "bad env", env: map[string]string{"GCAGENT_IMAGE_GC_HIGH_THRESHOLD": "lots"}, wantErr: "GCAGENT_IMAGE_GC_HIGH_THRESHOLD"},
		{name: "relative log dir", args: []string{"--log-dir=var/log/containers"}, wantErr: "invalid log dirs"},
		{name: "nested log dirs", args: []string{"--log-dir=/var/log/pods/x"}, wantErr: "invalid log dirs"},
		{name: "bad log level", args: []string{"--log-level=loud"}, wantErr: "invalid --log-level"},
		{name: "stray argument", args: []string{"now"}, wantErr: `unexpected argument "now"`},
		{name: "embedded NATS bounds default", check: func(c agent.Config) bool {
			po := c.PublisherOptions()
			return c.EmbeddedNATSMaxStore == 256<<20 && po.StreamMaxBytes == 256<<20-256<<10-16<<20 && po.StreamMaxAge == 7*24*time.Hour
		}},
		{name: "embedded max store too small", args: []string{"--embedded-nats-max-store=1000"}, wantErr: "invalid --embedded-nats-max-store 1000"},
		{name: "embedded max age below the dedupe window", args: []string{"--embedded-nats-max-age=1h"}, wantErr: "invalid --embedded-nats-max-age 1h"},
		{name: "embedded bounds ignored with a NATS URL", args: []string{"--nats-url=nats://127.0.0.1:4222", "--embedded-nats-max-store=1"},
			check: func(c agent.Config) bool { return c.PublisherOptions().StreamMaxBytes == 0 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseRun(tc.args, tc.env)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || strings.Contains(err.Error(), "\n") {
					t.Fatalf("error %v, want one line containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(cfg) {
				t.Fatalf("unexpected config %+v", cfg)
			}
		})
	}
}

func TestDispatchUsageErrors(t *testing.T) {
	for _, args := range [][]string{{}, {"frob"}, {"run", "--image-gc-high-threshold=-1"}, {"status", "--nope"}} {
		_, _, err := runCLI(context.Background(), nil, args...)
		var ue usageError
		if !errors.As(err, &ue) {
			t.Errorf("%v: got %v, want a usage error (exit 2)", args, err)
		}
	}
}
