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
	if len(lines) != 5 || !strings.Contains(lines[0], "created") || !strings.Contains(lines[4], events.BucketTrust+": created") {
		t.Fatalf("first apply said %q; want the stream and 4 buckets created", lines)
	}
	if lines, err = eventlog.Apply(ctx, js, month); err != nil || strings.Count(strings.Join(lines, "\n"), "unchanged") != 5 {
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
