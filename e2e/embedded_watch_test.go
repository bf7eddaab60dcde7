package e2e

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
	"github.com/gcagent/gcagent/schema"
)

// TestDefaultInstallWatchSeesNode: the README's default install (no
// --nats-url: the agent runs its embedded NATS server) gives a fleet view.
// `gcagent watch --json`, run as a local operator would with no NATS flags,
// shows this node's status. At 7485972 the embedded server's store could not
// hold the status stream beside the event stream ("insufficient storage
// resources available" at every heartbeat) and watch saw no node.
func TestDefaultInstallWatchSeesNode(t *testing.T) {
	t.Parallel()
	for _, v := range testenv.Versions() {
		t.Run(string(v), func(t *testing.T) {
			t.Parallel()
			c := testenv.StartContainerd(t, testenv.Options{Version: v})
			state := filepath.Join(t.TempDir(), "state")
			a := testenv.StartAgent(t, c, state, "--heartbeat-interval", "1s")
			natsWaitSynced(t, a)

			cmd := localTool(t, state, "watch", "--json", "--since", "0")
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
			seen := make(chan schema.NodeStatus, 16)
			go func() {
				sc := bufio.NewScanner(stdout)
				sc.Buffer(make([]byte, 1<<20), 1<<20)
				for sc.Scan() {
					var line struct {
						Status *schema.NodeStatus `json:"status"`
					}
					if json.Unmarshal(sc.Bytes(), &line) == nil && line.Status != nil {
						seen <- *line.Status
					}
				}
			}()
			select {
			case st := <-seen:
				if st.Node != natsNode {
					t.Fatalf("watch showed node %q, want %q", st.Node, natsNode)
				}
				t.Logf("watch saw %s (cluster %s)", st.Node, st.Cluster)
			case <-time.After(60 * time.Second):
				t.Fatalf("watch showed no node within 60s; watch stderr: %s\nagent log:\n%s", stderr.String(), a.LogTail(30))
			}
			if logHas(t, a, "insufficient storage") {
				t.Errorf("the agent logged a store refusal:\n%s", a.LogTail(30))
			}
		})
	}
}

// TestDryRunLogsWouldRemove: a dry run logs each image it would delete as
// "would remove", with the fields of the real removal line (namespace,
// image, digest, names, size_bytes, rule), and deletes nothing. At 7485972
// the line read `image skipped ... detail="would remove (space)"`: an
// operator grepping for "remov" found nothing that would go.
func TestDryRunLogsWouldRemove(t *testing.T) {
	t.Parallel()
	for _, v := range testenv.Versions() {
		t.Run(string(v), func(t *testing.T) {
			t.Parallel()
			c := testenv.StartContainerd(t, testenv.Options{Version: v})
			imgs := c.Import(t, testenv.Runnable("example.test/dry:1", testenv.Layer{Seed: "dry-run", Size: 512 << 10}))
			digest := imgs[0].Target.Digest.String()
			a := testenv.StartAgent(t, c, filepath.Join(t.TempDir(), "state"), "--dry-run",
				"--image-gc-high-threshold=1", "--image-gc-low-threshold=0", "--minimum-image-ttl-duration=1s")
			var line map[string]any
			testenv.Eventually(t, 30*time.Second, func() string {
				b, _ := os.ReadFile(a.LogFile)
				for _, l := range strings.Split(string(b), "\n") {
					var m map[string]any
					if json.Unmarshal([]byte(l), &m) == nil && m["message"] == "would remove" && m["digest"] == digest {
						line = m
						return ""
					}
				}
				return "no 'would remove' line for " + digest
			})
			for _, k := range []string{"namespace", "image", "names", "size_bytes", "rule", "kind", "dry_run"} {
				if _, ok := line[k]; !ok {
					t.Errorf("the would-remove line lacks %q: %v", k, line)
				}
			}
			if line["kind"] != "image" || line["rule"] != "space" || line["dry_run"] != true {
				t.Errorf("would-remove line %v, want kind image, rule space, dry_run true", line)
			}
			if !imageExists(t, c, digest) {
				t.Fatal("the dry run deleted the image")
			}
		})
	}
}
