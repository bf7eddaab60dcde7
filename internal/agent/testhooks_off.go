//go:build !testhooks

package agent

import (
	"context"

	"github.com/gcagent/gcagent/deletion"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/rs/zerolog"
)

// The shipped binary has no test hooks: see testhooks.go.

func crashHooks(*deletion.Options) {}

func testCallTimeout(zerolog.Logger) error { return nil }

func testSkew(string) (*clock.Skew, error) { return nil, nil }

func followTestSkew(context.Context, *clock.Skew, string, zerolog.Logger) error { return nil }
