package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/internal/testenv"
)

// TestFleetKeepListFromAnotherNATS: a node moved from its embedded server
// to a fleet NATS. The list the agent saved while on its embedded server
// (confirmed, empty: that server holds no fleet list) is not the fleet's:
// with the fleet's NATS not answering at the first start on it, image
// deletes wait for the fleet's list (keep-list-unread) as for a list
// never read, rather than taking the embedded server's empty list as
// read. Before, the saved list counted as read, nothing waited, and the
// image the fleet pattern names went in the first pass.
func TestFleetKeepListFromAnotherNATS(t *testing.T) {
	t.Parallel()
	forEachVersion(t, func(t *testing.T, v testenv.Version) {
		c := testenv.StartContainerd(t, testenv.Options{Version: v, RootSize: "128m"})
		kept := testenv.Image{Name: "registry.example/app:7", Layers: []testenv.Layer{{Seed: "moved-app", Size: 2 << 20}}}
		filler := testenv.Image{Name: "example.test/filler:1", Layers: []testenv.Layer{{Seed: "moved-filler", Size: 3 << 20}}}
		c.Import(t, kept, filler)
		state := filepath.Join(t.TempDir(), "state")

		// On its embedded server: the agent reads that server's (empty)
		// list and saves it, confirmed.
		first := testenv.StartAgent(t, c, state, "--image-gc-high-threshold", "100")
		testenv.Eventually(t, 60*time.Second, func() string {
			b, err := os.ReadFile(filepath.Join(state, "fleet-keep.json"))
			if err != nil {
				return err.Error()
			}
			var doc struct {
				ConfirmedAt time.Time `json:"confirmedAt"`
			}
			if err := json.Unmarshal(b, &doc); err != nil || doc.ConfirmedAt.IsZero() {
				return fmt.Sprintf("fleet-keep.json not confirmed yet (%v): %s", err, b)
			}
			return ""
		})
		first.Stop()

		// The fleet's NATS holds a list naming the app; it is down when
		// the agent first starts on it.
		fleet := startKeepServer(t, "go-module", 0, "")
		if out, err := gcagentCtl(t, "keep", "add", "registry.example/app:*", "--nats-url", fleet.url, "--cluster", natsCluster); err != nil {
			t.Fatalf("keep add: %v\n%s", err, out)
		}
		fleet.stop()
		a := testenv.StartAgent(t, c, state, "--nats-url", fleet.url, "--cluster", natsCluster,
			"--image-gc-high-threshold", "1", "--image-gc-low-threshold", "0", "--minimum-image-ttl-duration", "0s",
			"--keep-list-wait", "10m")
		testenv.Eventually(t, 60*time.Second, func() string {
			if imageGone(t, c, kept.Name) {
				return ""
			}
			var st imgStatus
			if code, err := a.Get("/status", &st); err != nil || code != 200 || st.ImageGC == nil || st.ImageGC.LastPass == nil {
				return fmt.Sprintf("no image GC pass yet (%d %v)", code, err)
			}
			if got := keptBy(a, kept.Name); got != "keep-list-unread fleet keep list never read" {
				return kept.Name + ": " + got
			}
			return ""
		})
		for _, img := range []testenv.Image{kept, filler} {
			if imageGone(t, c, img.Name) {
				t.Fatalf("%s deleted: the list saved from the embedded server was taken for the fleet's\n%s", img.Name, a.LogTail(30))
			}
		}
		if code, body, _ := readyz(a); code != 200 || !strings.Contains(body, "fleet keep list: never read") {
			t.Errorf("/readyz %d:\n%s", code, body)
		}
	})
}
