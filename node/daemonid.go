package node

import (
	"context"

	"github.com/containerd/errdefs/pkg/errgrpc"
)

// Containerd names the containerd the Source follows: its introspection
// service's UUID, which containerd keeps in its root (the same across its
// restarts; another for another daemon, or for one whose root was wiped),
// as read at the start of the current session, before anything was
// listed; "" before the first, or when containerd did not say. What was
// shown of that containerd (the pod log dir's evidence) is kept for it
// only. Safe for concurrent use; a nil Source names none.
func (s *Source) Containerd() string {
	if s == nil {
		return ""
	}
	if id := s.daemon.Load(); id != nil {
		return *id
	}
	return ""
}

// readContainerd reads containerd's UUID at the start of a session; a
// failure leaves it unknown (""), said once per run of failures.
func (s *Source) readContainerd(ctx context.Context) {
	id := ""
	info, err := s.o.Client.Server(ctx)
	switch {
	case err != nil && !s.daemonFailed:
		s.o.Log.Warn().Err(errgrpc.ToNative(err)).
			Msg("containerd does not say which daemon it is: the pod log dir's evidence from before is not used until it does")
	case err == nil:
		id = info.UUID
	}
	s.daemonFailed = err != nil
	if old := s.daemon.Swap(&id); old != nil && *old != id && *old != "" && id != "" {
		s.o.Log.Warn().Str("containerd", id).Str("was", *old).
			Msg("another containerd answers at this address: what was shown of the one before is not used")
	}
}
