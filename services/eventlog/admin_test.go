package eventlog_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Given no stream, when the admin applies the config, then the stream and
// every bucket are created, a second apply changes nothing, and a changed
// max_age is applied and reported as was → now. Given that stream, when a
// service with another config verifies it, then it is told the drift and
// the stream keeps the admin's retention (one host's config cannot shorten
// the fleet's log: 30 days stayed 30 days, not 25 hours).
func TestOnlyApplyChangesTheStreamAndVerifyReportsDrift(t *testing.T) {
	_, js, _ := testkit.NATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := eventlog.VerifyStream(ctx, js, eventlog.StreamConfig{}); !errors.Is(err, eventlog.ErrStreamMissing) {
		t.Fatalf("verify before apply: %v, want ErrStreamMissing", err)
	}
	month := eventlog.StreamConfig{MaxAge: 720 * time.Hour}
	lines, err := eventlog.Apply(ctx, js, month)
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) != 6 || !strings.Contains(lines[0], "created") || !strings.Contains(lines[4], events.BucketTrust+": created") ||
		!strings.Contains(lines[5], events.BucketScaleSets+": created") {
		t.Fatalf("first apply said %q; want the stream and 5 buckets created", lines)
	}
	if lines, err = eventlog.Apply(ctx, js, month); err != nil || strings.Count(strings.Join(lines, "\n"), "unchanged") != 6 {
		t.Fatalf("second apply: %v %q; want all unchanged", err, lines)
	}

	drift, err := eventlog.VerifyStream(ctx, js, eventlog.StreamConfig{MaxAge: 25 * time.Hour})
	if err != nil || len(drift) != 1 || !strings.HasPrefix(drift[0], "max_age 720h0m0s, want 25h0m0s") {
		t.Fatalf("verify with 25h: %v %q; want the max_age drift", err, drift)
	}
	if kv, err := eventlog.OpenBucket(ctx, js, events.BucketSnapshots, 1); err != nil || kv == nil {
		t.Fatalf("a service opening an existing bucket: %v", err)
	}
	s, err := js.Stream(ctx, events.StreamName)
	if err != nil || s.CachedInfo().Config.MaxAge != 720*time.Hour {
		t.Fatalf("after a service verified with 25h: %v, max_age %v; want 720h kept", err, s.CachedInfo().Config.MaxAge)
	}
	if lines, err = eventlog.Apply(ctx, js, eventlog.StreamConfig{MaxAge: 24 * time.Hour}); err != nil ||
		lines[0] != "stream "+events.StreamName+": updated: max_age 720h0m0s → 24h0m0s" {
		t.Fatalf("apply of 24h: %v %q", err, lines)
	}
}

// Given the buckets as `berth stream apply` makes them, when a credential
// puts its own key with a `Nats-Rollup: all` header (what an agent may
// publish on its heartbeat key), then the server refuses it and every
// other key stays: a rollup would purge the whole bucket, other hosts'
// heartbeats, every snapshot and every parking record (issue 16).
func TestABucketCannotBeRolledUpThroughOnesOwnKey(t *testing.T) {
	_, js, nc := testkit.NATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := eventlog.Apply(ctx, js, eventlog.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, events.BucketHeartbeats)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "host-b", []byte(`{"host":"host-b"}`)); err != nil {
		t.Fatal(err)
	}
	msg := nats.NewMsg("$KV." + events.BucketHeartbeats + ".host-a")
	msg.Data = []byte(`{"host":"host-a"}`)
	msg.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupAll)
	if _, err := js.PublishMsg(ctx, msg); err == nil {
		t.Fatal("a rollup through one's own key was stored")
	}
	if _, err := kv.Get(ctx, "host-b"); err != nil {
		t.Fatalf("host-b's heartbeat after the rollup attempt: %v", err)
	}
	st, err := js.Stream(ctx, "KV_"+events.BucketHeartbeats)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(ctx); err == nil {
		t.Fatal("the heartbeat bucket's stream was purged")
	}
	_ = nc
}
