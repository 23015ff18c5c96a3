// Package events holds Berth's event log vocabulary and its pure folds.
//
// Everything Berth knows is a fact in the JetStream stream BERTH_EVENTS: a
// CloudEvents 1.0 structured JSON envelope whose data is one of the payloads in
// this package's catalogue. Services rebuild their state by folding the log
// with [Fleet.Apply]; the fold has no I/O, tolerates duplicates and
// out-of-order arrival, and exposes the fleet's invariants through
// [Fleet.Check].
//
// This package must not import NATS, GitHub or AWS code (a test enforces it),
// so that any tool can fold the log.
package events
