// Package eventlog is Berth's plumbing to NATS JetStream: the stream,
// appending facts with idempotency and optimistic concurrency, and
// following the log into a fold. The embedded nats-server lives apart, in
// package natsembed, which only wiring and tests import.
package eventlog
