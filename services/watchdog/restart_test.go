package watchdog_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/services/watchdog"
	"github.com/nats-io/nats.go/jetstream"
)

// Given a host that announced itself long ago and heartbeats now, when a
// watchdog starts (a restart), then it does not report the host lost: it
// reads the heartbeats before its first decision (law 7: data it has not
// read yet is not a fact).
func TestAWatchdogStartingUpDoesNotLoseHostsThatHeartbeat(t *testing.T) {
	js, app := testkit.Log(t, "test")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	long := time.Now().Add(-time.Hour)
	if _, _, err := app.Append(ctx, app.New(long, events.HostOnline{Host: "h-a", Boot: "b", PhysicalCap: 2, At: long}), nil); err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: events.BucketHeartbeats, History: 1})
	if err != nil {
		t.Fatal(err)
	}
	hb, _ := json.Marshal(map[string]any{"host": "h-a", "at": time.Now().UTC()})
	if _, err := kv.Put(ctx, "h-a", hb); err != nil {
		t.Fatal(err)
	}
	// A snapshot that covers the whole log, as after a restart: the loop
	// decides at once, before any heartbeat update can arrive.
	folded, err := eventlog.Replay(ctx, js, nil)
	if err != nil {
		t.Fatal(err)
	}
	snap, _ := events.MarshalSnapshot(folded)
	skv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: events.BucketSnapshots, History: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := skv.Put(ctx, "watchdog", snap); err != nil {
		t.Fatal(err)
	}
	p := params
	p.HostTTL = 30 * time.Second
	w := watchdog.New(js, app, p, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	w.Loop.Tick = 20 * time.Millisecond
	w.Loop.SnapshotKey = "watchdog"
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(rctx) }()
	testkit.Eventually(t, 10*time.Second, "the watchdog caught up", w.Loop.CaughtUp)
	// Its decisions (one per 20 ms tick) must not lose the host.
	testkit.Consistently(t, 300*time.Millisecond, "the heartbeating host is not lost", func() bool {
		f, err := eventlog.Replay(ctx, js, nil)
		return err == nil && f.Hosts["h-a"].State == events.HostStateOnline
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	f, err := eventlog.Replay(ctx, js, nil)
	if err != nil {
		t.Fatal(err)
	}
	if h := f.Hosts["h-a"]; h.State != events.HostStateOnline {
		t.Fatalf("a host heartbeating now was judged %s at the watchdog's start", h.State)
	}
}
