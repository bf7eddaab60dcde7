//go:build testhooks

package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/node"
	"github.com/rs/zerolog"
)

// This file is built only with -tags testhooks: the end-to-end tests'
// builds have it, the shipped binary does not (e2e TestShippedBinary).

// killAfterDeleteEnv, when it names a kind (image, container, log), makes
// the agent send itself SIGKILL right after its first delete of that kind,
// before the delete's event is stored, so that end-to-end tests can show
// the intent turning into exactly one event after the restart.
const killAfterDeleteEnv = "GCAGENT_TEST_KILL_AFTER_DELETE"

// killAfterIntentEnv is the same one step earlier: SIGKILL right after the
// intent is recorded, before the delete.
const killAfterIntentEnv = "GCAGENT_TEST_KILL_AFTER_INTENT"

// callTimeoutEnv, a Go duration, replaces node.CallTimeout (30 s): the
// end-to-end tests of a hung containerd wait out seconds, not 30 s.
const callTimeoutEnv = "GCAGENT_TEST_CALL_TIMEOUT"

// testCallTimeout applies callTimeoutEnv; it runs before any client is made.
func testCallTimeout(log zerolog.Logger) error {
	s := os.Getenv(callTimeoutEnv)
	if s == "" {
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return fmt.Errorf("%s=%q: want a positive duration", callTimeoutEnv, s)
	}
	node.SetCallTimeout(d)
	log.Warn().Float64("call_timeout_s", d.Seconds()).Msg("test call timeout enabled (" + callTimeoutEnv + ")")
	return nil
}

// crashHooks arms the kill hooks the environment asks for.
func crashHooks(o *deletion.Options) {
	if kind := os.Getenv(killAfterIntentEnv); kind != "" {
		o.AfterIntent = func(in deletion.Intent) {
			if in.Kind == kind {
				killSelf()
			}
		}
	}
	if kind := os.Getenv(killAfterDeleteEnv); kind != "" {
		o.AfterDelete = func(in deletion.Intent) {
			if in.Kind == kind {
				killSelf()
			}
		}
	}
}

// killSelf is kill -9 of this process.
func killSelf() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL cannot be caught: the process ends here
}

// testSkew is the emulated wall-clock offset clock.TestOffsetEnv asks
// for, going on from the steps an earlier run on stateDir saved; nil when
// unset.
func testSkew(stateDir string) (*clock.Skew, error) {
	s, err := clock.SkewFromEnv()
	if s == nil || err != nil {
		return s, err
	}
	return s, s.Keep(filepath.Join(stateDir, clock.TestSkewHistoryFile), filepath.Join(stateDir, clock.TestOffsetFile))
}

// followTestSkew re-reads the test-only clock offset file until ctx ends:
// end-to-end tests step the emulated wall clock by writing it.
func followTestSkew(ctx context.Context, skew *clock.Skew, path string, log zerolog.Logger) error {
	log.Warn().Str("component", "clock").Float64("offset_s", skew.Get().Seconds()).Msg("test clock offset enabled (" + clock.TestOffsetEnv + ")")
	t := time.NewTicker(clock.TestOffsetPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if skew.ReadFile(path) {
				log.Warn().Str("component", "clock").Float64("offset_s", skew.Get().Seconds()).Msg("test clock offset stepped")
			}
		}
	}
}
