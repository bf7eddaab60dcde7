package suggest

import "testing"

func TestDidYouMean(t *testing.T) {
	known := []string{"--nats-url", "--nats-user", "--release-after", "--heartbeat"}
	for typed, want := range map[string]string{
		"--nats-ur":        " (did you mean --nats-url?)",
		"--RELEASE-AFTER":  " (did you mean --release-after?)",
		"--heartbeats":     " (did you mean --heartbeat?)",
		"--nats":           " (did you mean --nats-url or --nats-user?)",
		"--zzzzzzzzzzzzzz": "",
		"":                 "",
	} {
		if got := DidYouMean(typed, known); got != want {
			t.Errorf("DidYouMean(%q) = %q, want %q", typed, got, want)
		}
	}
}
