package agent

import (
	"slices"
	"testing"
	"time"

	"github.com/gcagent/gcagent/natsbus"
	"github.com/rs/zerolog"
)

// TestFleetKeepFollowsTheWatchAndPersists: the agent applies its
// cluster's and the all-clusters key, ignores other clusters and bad
// patterns, forgets keys gone while it was away, and restores the last
// list from its state dir with the time NATS last confirmed it.
func TestFleetKeepFollowsTheWatchAndPersists(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	k := loadFleetKeep(dir, "prod", clock, zerolog.Nop())
	changes := 0
	k.changed = func() { changes++ }
	k.seen = map[string]bool{}
	k.apply(natsbus.KeepUpdate{Key: natsbus.KeepAllKey, List: natsbus.KeepList{Patterns: []string{"base/*", "[bad"}}})
	k.apply(natsbus.KeepUpdate{Key: natsbus.KeepClusterKey("prod"), List: natsbus.KeepList{Patterns: []string{"app:*"}}})
	k.apply(natsbus.KeepUpdate{Synced: true})
	if got := k.Patterns(); !slices.Equal(got, []string{"app:*", "base/*"}) || changes != 2 {
		t.Fatalf("patterns %v after %d changes", got, changes)
	}
	if age, ok := k.Age(now.Add(90 * time.Second)); !ok || age != 90*time.Second || k.detail(now.Add(90*time.Second)) == "" {
		t.Fatalf("age %s %v, detail %q", age, ok, k.detail(now.Add(90*time.Second)))
	}

	now = now.Add(time.Hour) // a restart without NATS keeps the list and its age
	k2 := loadFleetKeep(dir, "prod", clock, zerolog.Nop())
	if got := k2.Patterns(); !slices.Equal(got, []string{"app:*", "base/*"}) {
		t.Fatalf("restored %v", got)
	}
	if age, ok := k2.Age(now); !ok || age != time.Hour {
		t.Fatalf("restored age %s %v", age, ok)
	}
	// The watch delivers only the all-clusters key now: prod's was deleted.
	k2.seen = map[string]bool{}
	k2.apply(natsbus.KeepUpdate{Key: natsbus.KeepAllKey, List: natsbus.KeepList{Patterns: []string{"base/*"}}})
	k2.apply(natsbus.KeepUpdate{Synced: true})
	if got := k2.Patterns(); !slices.Equal(got, []string{"base/*"}) {
		t.Fatalf("after the resync %v", got)
	}
	if age, _ := k2.Age(now); age != 0 || k2.detail(now) != "" {
		t.Fatalf("age %s after a resync", age)
	}
	if s := k2.Setting(now); s.Name != "fleet-keep" || s.Value != "base/*" {
		t.Fatalf("setting %+v", s)
	}
}
