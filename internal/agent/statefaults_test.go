package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/projection"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// TestStateResetSaysWhatIsLost: the line of a state file moved aside names
// everything the file held that is gone, the usage trace too (what
// gcagent replay reads; on d7dd547 lost= named the LRU history only).
func TestStateResetSaysWhatIsLost(t *testing.T) {
	var buf bytes.Buffer
	a := &agent{reg: prometheus.NewRegistry(), log: zerolog.New(&buf), pub: gc.Discard{}}
	a.reportStateReset(&projection.Reset{Path: "/s/state.db", MovedTo: "/s/state.db.corrupt-1", Err: errors.New("bad page"), At: time.Now()})
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatal(err)
	}
	lost, _ := line["lost"].(string)
	for _, want := range []string{"LRU history", "usage trace"} {
		if !strings.Contains(lost, want) {
			t.Errorf("lost=%q does not name %s", lost, want)
		}
	}
}
