package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestParseRunNerdctlDataRoot: --nerdctl-data-root defaults to nerdctl's
// own default, is read from the flag, the environment and the config file
// like every setting, and must be absolute.
func TestParseRunNerdctlDataRoot(t *testing.T) {
	file := filepath.Join(t.TempDir(), "gcagent.conf")
	if err := os.WriteFile(file, []byte("nerdctl-data-root = /srv/nerdctl\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		args    []string
		env     map[string]string
		want    string
		wantErr string
	}{
		{name: "default", want: "/var/lib/nerdctl"},
		{name: "flag", args: []string{"--nerdctl-data-root=/data/nerdctl"}, want: "/data/nerdctl"},
		{name: "env", env: map[string]string{"GCAGENT_NERDCTL_DATA_ROOT": "/home/u/.local/share/nerdctl"}, want: "/home/u/.local/share/nerdctl"},
		{name: "file", args: []string{"--config", file}, want: "/srv/nerdctl"},
		{name: "flag beats env", args: []string{"--nerdctl-data-root=/a"}, env: map[string]string{"GCAGENT_NERDCTL_DATA_ROOT": "/b"}, want: "/a"},
		{name: "relative", args: []string{"--nerdctl-data-root=var/lib/nerdctl"}, wantErr: `invalid --nerdctl-data-root "var/lib/nerdctl": must be an absolute path`},
		{name: "empty", args: []string{"--nerdctl-data-root="}, wantErr: `invalid --nerdctl-data-root ""`},
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
			if cfg.NerdctlDataRoot != tc.want {
				t.Errorf("data root %q, want %q", cfg.NerdctlDataRoot, tc.want)
			}
		})
	}
}
