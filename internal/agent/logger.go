package agent

import (
	"io"
	"os"
	"strings"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// LogTimeFormat is the time of every log line: RFC 3339 in UTC with
// milliseconds (zerolog's default has whole seconds, too coarse for
// reactions measured in milliseconds).
const LogTimeFormat = "2006-01-02T15:04:05.000Z07:00"

// NewLogger is the agent's logger as cfg says (format, level, node). In
// console format, colours go only to a terminal, and a size field (named
// *_bytes, as in JSON) reads as a person would write it. It sets zerolog's
// time format (a process-wide setting) to LogTimeFormat.
func NewLogger(cfg Config, w io.Writer) zerolog.Logger {
	zerolog.TimeFieldFormat = LogTimeFormat
	zerolog.TimestampFunc = func() time.Time { return time.Now().UTC() }
	if cfg.LogFormat == "console" {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000", NoColor: !IsTerminal(w), FormatPrepare: humanSizes}
	}
	level, err := zerolog.ParseLevel(cfg.LogLevel)
	if err != nil || cfg.LogLevel == "" {
		level = zerolog.InfoLevel
	}
	return zerolog.New(w).Level(level).With().Timestamp().Str("node", cfg.NodeName).Logger()
}

// humanSizes rewrites the *_bytes fields of a console line: 73400320
// becomes 70.0 MiB.
func humanSizes(fields map[string]any) error {
	for k, v := range fields {
		if !strings.HasSuffix(k, "_bytes") {
			continue
		}
		if n, ok := v.(float64); ok { // JSON numbers decode as float64
			fields[k] = gc.HumanBytes(int64(n))
		}
	}
	return nil
}

// IsTerminal reports whether w is a terminal (colours and redraws only
// there, never into a pipe).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
