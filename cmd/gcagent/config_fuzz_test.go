package main

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzConfigFile feeds arbitrary config file contents to parseRun. It must
// return an error or a agent.Config that passes Validate, never panic: a broken
// file on one node must end in exit status 2 and one line, not a crash.
func FuzzConfigFile(f *testing.F) {
	f.Add([]byte("# fleet defaults\nimage-gc-high-threshold = 90\nimage-gc-low-threshold = 70\nkeep-image = \"registry.test/*\"\n"))
	f.Add([]byte("prune-containers = all\nminimum-container-ttl-duration = 1h\nmaximum-dead-containers = -1\n"))
	f.Add([]byte("image-gc-high-threshold = 101\n"))
	f.Add([]byte("config = /etc/other\n"))
	f.Add([]byte("no equals sign\n"))
	f.Add([]byte("log-dir = relative\n"))
	f.Add([]byte("keep-image = [x\n"))
	f.Add([]byte("pod-log-grace = 9223372036854775807ns\nimage-maximum-gc-age = -1s\n"))
	f.Add([]byte("namespace = \"\"\nnats-url = \"nats://\x00\"\n= x\n"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, content []byte) {
		file := filepath.Join(dir, "gcagent.conf")
		if err := os.WriteFile(file, content, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := parseRun([]string{"--config", file}, nil)
		if err == nil {
			if verr := cfg.Validate(); verr != nil {
				t.Fatalf("accepted a config that does not validate: %v", verr)
			}
		}
	})
}

// FuzzEnvValue sets one GCAGENT_* variable (picked from the real flags) to
// an arbitrary value. parseRun must return an error naming the variable or
// a agent.Config that passes Validate, never panic.
func FuzzEnvValue(f *testing.F) {
	names := runSettings()
	for i, v := range []string{"90", "-1", "1e400", "all", "5m", "-5m", "", "[x", "relative/dir", "\x00", "loud", "0x10", "true"} {
		f.Add(uint8(i), v)
	}
	f.Fuzz(func(t *testing.T, pick uint8, value string) {
		name := envName(names[int(pick)%len(names)])
		if name == "GCAGENT_CONFIG" {
			return // a path: FuzzConfigFile covers the contents
		}
		cfg, err := parseRun(nil, map[string]string{name: value})
		if err == nil {
			if verr := cfg.Validate(); verr != nil {
				t.Fatalf("%s=%q accepted but does not validate: %v", name, value, verr)
			}
		}
	})
}
