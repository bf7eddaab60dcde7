package agent

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"time"

	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/version"
	"github.com/gcagent/gcagent/natsbus"
	"github.com/gcagent/gcagent/projection"
	"github.com/gcagent/gcagent/schema"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

func (c Config) ConnOptions() natsbus.ConnOptions {
	return natsbus.ConnOptions{
		URL: c.NATSURL, Cluster: c.Cluster, Node: c.NodeName,
		CredsFile: c.NATSCreds, NkeyFile: c.NATSNKey, User: c.NATSUser, Password: c.NATSPassword, Token: c.NATSToken,
		TLSCA: c.NATSTLSCA, TLSCert: c.NATSTLSCert, TLSKey: c.NATSTLSKey,
	}
}

func (c Config) PublisherOptions() natsbus.PublisherOptions {
	o := natsbus.PublisherOptions{
		Cluster: c.Cluster, Node: c.NodeName, StateDir: c.StateDir, Stream: c.NATSStream,
		NoCreateStream: c.NATSNoCreateStream, Domain: c.NATSJSDomain, MaxBytes: c.OutboxMaxBytes, MaxAge: c.OutboxMaxAge,
		DuplicateWindow: max(c.OutboxMaxAge, natsbus.DefaultDuplicateWindow),
		StreamMaxAge:    max(c.OutboxMaxAge, natsbus.DefaultStreamMaxAge),
	}
	if c.NATSURL == "" {
		// The embedded server's stream lives on this node's disk: it gets
		// its share of the store (embeddedShares) and its own age.
		o.StreamMaxBytes, _ = embeddedShares(c.EmbeddedNATSMaxStore)
		o.StreamMaxAge = max(c.EmbeddedNATSMaxAge, o.DuplicateWindow)
	}
	return o
}

// StatusOptions are the options of the node's status writer: next to the
// event stream, in the same domain, with the same create rule.
func (c Config) StatusOptions(log zerolog.Logger) natsbus.StatusOptions {
	o := natsbus.StatusOptions{Cluster: c.Cluster, Node: c.NodeName, Domain: c.NATSJSDomain,
		NoCreateStream: c.NATSNoCreateStream, Logger: log}
	if c.NATSURL == "" {
		_, o.MaxBytes = embeddedShares(c.EmbeddedNATSMaxStore)
	}
	return o
}

// embeddedShares divides the embedded server's store between the three
// streams it holds: the fleet keep list bucket's fixed share, the node
// status (a sixteenth, between 64 KiB and the status stream's default
// bound) and the events (the rest). JetStream reserves each stream's
// MaxBytes in the store and refuses a stream that does not fit, so the
// shares add up to the store exactly.
func embeddedShares(store int64) (events, status int64) {
	status = min(natsbus.DefaultStatusMaxBytes, max(store/16, 1<<16))
	return store - natsbus.EmbeddedKeepMaxBytes - status, status
}

// Embedded NATS store bounds: the default, and the least that holds a
// stream of events at all.
const (
	DefaultEmbeddedNATSMaxStore = 256 << 20
	minEmbeddedNATSMaxStore     = 1 << 20
)

// embeddedOptions are the embedded server's options (without auth and logger).
func (c Config) EmbeddedOptions() natsbus.EmbeddedOptions {
	return natsbus.EmbeddedOptions{StateDir: c.StateDir, Listen: c.EmbeddedNATSListen,
		ServerName: natsbus.SafeToken(c.NodeName), MaxStore: c.EmbeddedNATSMaxStore}
}

// bus is the agent's NATS side: connection, publisher, maybe a server.
type bus struct {
	emb    *natsbus.Embedded // nil with --nats-url
	nc     *nats.Conn
	pub    *natsbus.Publisher
	status *natsbus.StatusWriter // the node's last value, put with every heartbeat
	// statusBusy is set while a status put is in flight.
	statusBusy atomic.Bool
}

// embeddedURL only names the embedded server in logs: the agent reaches it
// in process, never through its port.
const embeddedURL = "nats://embedded"

// startNATS starts the embedded server when no --nats-url is given,
// connects (never giving up), and opens the durable publisher. NATS being
// down does not stop the agent: events wait in the outbox. An embedded
// server whose address is taken still runs: the agent talks to it in
// process, and only its listener, for local tools, is retried in the
// background.
//
// The embedded server accepts one user, the nkey whose seed is in the state
// dir (0600), which the agent and local `gcagent watch`/`ctl` use; it
// listens where EmbeddedNATSListen says and records its URL next to the
// seed once it does (a URL an earlier run recorded is removed first).
func (a *agent) startNATS() (*bus, error) {
	cfg := a.cfg
	// natsbus's constructors name their own component in the log.
	b := &bus{}
	opts := cfg.ConnOptions()
	opts.Logger = a.log
	opts.InboxPrefix = natsbus.InboxPrefix(cfg.Cluster, cfg.NodeName)
	var ncReady atomic.Pointer[nats.Conn]
	if opts.URL == "" {
		seed, pub, err := natsbus.EnsureLocalNkey(cfg.StateDir)
		if err != nil {
			return nil, err
		}
		eo := cfg.EmbeddedOptions()
		eo.Logger, eo.AuthNkey = a.log, pub
		if err := natsbus.RemoveLocalURL(cfg.StateDir); err != nil {
			a.log.Warn().Str("component", "natsbus").Err(err).Msg("cannot remove the embedded NATS URL an earlier run recorded")
		}
		emb, err := natsbus.RunEmbedded(eo, natsbus.EmbeddedRunOptions{Registerer: a.reg,
			OnUp: func() {
				if nc := ncReady.Load(); nc != nil && !nc.IsConnected() {
					_ = nc.ForceReconnect() // do not wait for the reconnect backoff
				}
			},
			OnListen: func(url string) {
				if err := natsbus.WriteLocalURL(cfg.StateDir, url); err != nil {
					a.log.Error().Str("component", "natsbus").Err(err).Msg("cannot record the embedded NATS URL for local tools")
				}
			}})
		if err != nil {
			return nil, fmt.Errorf("embedded nats: %w", err)
		}
		b.emb = emb
		if a.keep != nil {
			// The list lives in this server's store: while it does not
			// run, nothing can change what the agent saved of it.
			a.keep.setOwnServer(func() bool { return !emb.Running() })
		}
		opts.URL, opts.InProcess, opts.NkeyFile = embeddedURL, emb, seed
	}
	nc, err := natsbus.Connect(opts)
	if err != nil {
		b.close()
		return nil, fmt.Errorf("nats: %w", err)
	}
	b.nc = nc
	ncReady.Store(nc)
	m, err := natsbus.NewMetrics(a.reg)
	if err != nil {
		b.close()
		return nil, err
	}
	po := cfg.PublisherOptions()
	po.Logger, po.Metrics = a.log, m
	if b.pub, err = natsbus.NewPublisher(nc, po); err != nil {
		b.close()
		return nil, fmt.Errorf("nats publisher: %w", err)
	}
	if b.status, err = natsbus.NewStatusWriter(nc, cfg.StatusOptions(a.log)); err != nil {
		b.close()
		return nil, fmt.Errorf("nats status: %w", err)
	}
	url := natsbus.RedactURL(opts.URL)
	if b.emb != nil {
		url = b.emb.ClientURL() // where local tools reach it ("" until it listens)
	}
	a.log.Info().Str("component", "natsbus").Str("url", url).Bool("embedded", b.emb != nil).Bool("connected", nc.IsConnected()).
		Str("stream", cfg.NATSStream).Msg("event outbox open: events go to NATS as it stores them")
	return b, nil
}

// close flushes what it can, then stops the connection and the server.
func (b *bus) close() {
	if b.pub != nil {
		_ = b.pub.Close()
	}
	if b.nc != nil {
		b.nc.Close()
	}
	if b.emb != nil {
		b.emb.Close()
	}
}

// problem says why the embedded server is not running ("" when it runs or
// with --nats-url).
func (b *bus) problem() string {
	if b == nil || b.emb == nil {
		return ""
	}
	return b.emb.Problem()
}

// startedAction is the agent.started event of this boot.
func (a *agent) startedAction(boot time.Time) gc.Action {
	host, _ := os.Hostname()
	return gc.Action{Kind: "agent", Action: "started", Subject: a.cfg.NodeName, Key: fmt.Sprint(boot.UnixNano()),
		Data: schema.AgentStarted{Version: version.Version, Hostname: host, Namespace: a.cfg.Namespace,
			ExcludeNamespace: a.cfg.ExcludeNamespace, DryRun: a.cfg.DryRun,
			PruneContainers: a.cfg.PruneContainers, ImageGCHighThreshold: a.cfg.ImageGCHighThreshold,
			ImageGCLowThreshold: a.cfg.ImageGCLowThreshold, Policy: a.cfg.Policy(), KubeletNotes: a.kubeletNotes()}}
}

// Heartbeat is schema.Heartbeat: the data of agent.heartbeat.
type Heartbeat = schema.Heartbeat

// heartbeat builds the current heartbeat from the projection and the disk.
func (a *agent) heartbeat(now time.Time, b *bus) Heartbeat {
	var hb Heartbeat
	disk, err := a.imageFS.Disk()
	if err != nil {
		hb.DiskError = err.Error()
	} else {
		hb.CapacityBytes, hb.AvailableBytes = disk.CapacityBytes, disk.AvailableBytes
		if disk.CapacityBytes > 0 {
			hb.DiskUsagePercent = 100 - int(min(disk.AvailableBytes, disk.CapacityBytes)*100/disk.CapacityBytes)
		}
	}
	hb.Synced = a.live.Synced()
	a.live.ViewAll(func(states []*projection.State) {
		for _, s := range states {
			hb.Images += len(s.Images)
			hb.Containers += len(s.Containers)
		}
		hb.ReclaimableBytes = a.reclaimableBytes(states, now)
	})
	if b != nil && b.pub != nil { // NewControl's agent has no bus
		hb.Outbox, hb.NATSMode = b.pub.Depth(), b.pub.Mode()
	}
	if a.lastGC != nil {
		hb.LastGC = a.lastGC()
	}
	return hb
}

// reclaimableBytes is what image GC could delete now if the disk were full:
// the sizes of the images no rule protects. Call it inside live.ViewAll.
func (a *agent) reclaimableBytes(states []*projection.State, now time.Time) int64 {
	return gc.ReclaimableBytes(states, a.imagePolicy(), now)
}

// runHeartbeat publishes agent.heartbeat every interval, the first one
// splayed randomly over the interval so a fleet does not beat in step.
func (a *agent) runHeartbeat(ctx context.Context, b *bus, boot time.Time) error {
	every := a.cfg.HeartbeatInterval
	t := time.NewTimer(rand.N(every))
	defer t.Stop()
	for seq := 1; ; seq++ {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		now := time.Now().UTC()
		hb := a.heartbeat(now, b)
		_ = a.pub.Publish(gc.Action{Kind: "agent", Action: "heartbeat", Subject: a.cfg.NodeName,
			Key: fmt.Sprintf("%d/%d", boot.UnixNano(), seq), Data: hb})
		a.putStatus(ctx, b, now, hb)
		t.Reset(every)
	}
}

// putStatus stores the node's status as its last value in the
// background, so that neither GC nor the heartbeat's cadence waits for
// NATS; while a put is still in flight (NATS slow or away: it waits at most
// the writer's timeout) the new value is skipped, and the next heartbeat
// brings a newer one. A failed put is logged once per cause.
func (a *agent) putStatus(ctx context.Context, b *bus, now time.Time, hb Heartbeat) {
	if b == nil || b.status == nil || !b.statusBusy.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer b.statusBusy.Store(false)
		a.putStatusNow(ctx, b, now, hb)
	}()
}

// putStatusNow is putStatus's put; one runs at a time (statusBusy).
func (a *agent) putStatusNow(ctx context.Context, b *bus, now time.Time, hb Heartbeat) {
	st := schema.NodeStatus{Cluster: a.cfg.Cluster, Node: a.cfg.NodeName, Version: version.Version, At: now,
		HeartbeatIntervalSeconds: a.cfg.HeartbeatInterval.Seconds(),
		ImageGCHighThreshold:     a.cfg.ImageGCHighThreshold, ImageGCLowThreshold: a.cfg.ImageGCLowThreshold,
		Heartbeat: hb}
	err := b.status.Put(ctx, st)
	why := ""
	if err != nil {
		why = err.Error()
	}
	if why != a.statusErr {
		if err != nil {
			a.log.Warn().Str("component", "natsbus").Err(err).Msg("cannot put the node status; trying again at the next heartbeat")
		} else {
			a.log.Info().Str("component", "natsbus").Msg("node status put again")
		}
		a.statusErr = why
	}
}

// imagePolicy is the policy image GC passes use now: the configuration plus
// the sandbox images learned at run time, so that tools explain what GC
// does. Safe inside live.View.
func (a *agent) imagePolicy() gc.ImagePolicy {
	if a.imageGC != nil {
		return a.imageGC.Policy()
	}
	return a.cfg.ImagePolicy()
}

// imagePolicy is the image GC policy of the configuration (without the
// sandbox images learned at run time).
func (c Config) ImagePolicy() gc.ImagePolicy {
	p := gc.ImagePolicy{
		HighThresholdPercent: c.ImageGCHighThreshold, LowThresholdPercent: c.ImageGCLowThreshold,
		MinAge: c.MinimumImageTTL, MaxAge: c.ImageMaximumGCAge, KeepPatterns: c.KeepImages, FleetKeepWait: c.KeepListWait,
	}
	if c.SandboxImage != "" {
		p.SandboxImages = []string{c.SandboxImage}
	}
	return p
}
