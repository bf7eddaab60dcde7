// Package natsbus publishes gcagent's actions to NATS as CloudEvents through a
// durable local outbox, connects to NATS the way a long-running node agent
// must, and can run an embedded NATS server with JetStream.
//
// Delivery contract. Every action becomes one CloudEvent whose id is
// sha256(cluster/node/kind/action/key), computed once and stored with the
// event in the outbox (fsync'd) before the first send. Every send of the
// event, by this process or by the next one after a crash, carries that id as
// Nats-Msg-Id, so JetStream stores it once and acks a retry as a duplicate.
// This holds while a retry falls inside the stream's duplicate window, which
// is why the created stream's window (DuplicateWindow, default 24h) may not be
// shorter than the longest time an event can wait in the outbox (MaxAge,
// default 24h); the server keeps one small record per id inside the window.
// Events that wait longer, or that do not fit the outbox's bounds, are
// dropped oldest first, logged and counted, never silently. Without JetStream
// (or without the stream when the Publisher may not create it) events go out
// with core publish: at least once while connected, no persistence, no dedupe.
package natsbus
