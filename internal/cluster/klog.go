package cluster

import (
	"fmt"

	"github.com/go-logr/logr"
	"github.com/rs/zerolog"
	"k8s.io/klog/v2"
)

// RouteKlog sends what client-go logs through klog (informers' list
// errors, the event recorder, leader election) to log, one zerolog line
// each with component client-go: errors at warn, klog's level 0 at info,
// its verbose levels at debug.
func RouteKlog(log zerolog.Logger) {
	klog.SetLogger(logr.New(&klogSink{log: log.With().Str("component", "client-go").Logger()}))
}

type klogSink struct {
	log    zerolog.Logger
	name   string
	values []any
}

func (s *klogSink) Init(logr.RuntimeInfo) {}
func (s *klogSink) Enabled(level int) bool {
	return level <= 0 || s.log.GetLevel() <= zerolog.DebugLevel
}

func (s *klogSink) Info(level int, msg string, kv ...any) {
	ev := s.log.Info()
	if level > 0 {
		ev = s.log.Debug()
	}
	s.fields(ev, kv).Msg(msg)
}

func (s *klogSink) Error(err error, msg string, kv ...any) {
	s.fields(s.log.Warn().Err(err), kv).Msg(msg)
}

func (s *klogSink) fields(ev *zerolog.Event, kv []any) *zerolog.Event {
	all := append(append([]any{}, s.values...), kv...)
	for i := 0; i+1 < len(all); i += 2 {
		k, ok := all[i].(string)
		if !ok {
			k = fmt.Sprint(all[i])
		}
		ev = ev.Str(k, fmt.Sprint(all[i+1]))
	}
	if s.name != "" {
		ev = ev.Str("logger", s.name)
	}
	return ev
}

func (s *klogSink) WithValues(kv ...any) logr.LogSink {
	c := *s
	c.values = append(append([]any{}, s.values...), kv...)
	return &c
}

func (s *klogSink) WithName(name string) logr.LogSink {
	c := *s
	if c.name != "" {
		name = c.name + "/" + name
	}
	c.name = name
	return &c
}
