//go:build noembeddednats

package natsbus

import "errors"

// EmbeddedBuilt says whether this binary holds the embedded NATS server:
// built with -tags noembeddednats it does not (its code is a quarter of the
// binary), and needs a NATS of its own (--nats-url).
const EmbeddedBuilt = false

// errNotBuilt is what starting the embedded server says in such a binary.
var errNotBuilt = errors.New("natsbus: this gcagent was built without the embedded NATS server (-tags noembeddednats)")

func startServer(EmbeddedOptions) (runningServer, error) { return nil, errNotBuilt }
