package natsbus

import (
	_ "github.com/nats-io/nats-server/v2/server"
	_ "github.com/nats-io/nats.go"
	_ "github.com/nats-io/nats.go/jetstream"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/testutil"
	_ "github.com/rs/zerolog"
	_ "go.etcd.io/bbolt"
)
