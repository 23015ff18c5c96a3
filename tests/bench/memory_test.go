package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/nats-io/nats.go/jetstream"
)

// Given the snapshot bucket, when the dispatcher's snapshot is stored
// whole and the watchdog's in parts, then the memory phase's wait for
// first snapshots ends; and given an agent that never stores one, then
// the wait fails at its deadline naming that agent, not hanging.
func TestTheMemoryPhaseWaitsForEveryServicesFirstSnapshot(t *testing.T) {
	_, js, _ := testkit.NATS(t)
	ctx := context.Background()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: events.BucketSnapshots})
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{events.SnapshotKeyDispatcher, events.SnapshotKeyWatchdog}
	done := make(chan error, 1)
	go func() { done <- firstSnapshots(ctx, js, keys, time.Minute) }()
	if _, err := kv.Put(ctx, events.SnapshotKeyDispatcher, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, events.SnapshotPartKey(events.SnapshotKeyWatchdog, 1, 0), []byte("{")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("both snapshots stored, and the wait failed: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("both snapshots stored, and the wait did not end")
	}

	agent := events.SnapshotKeyAgent("host-0")
	err = firstSnapshots(ctx, js, append(keys, agent), 200*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), agent) {
		t.Fatalf("no snapshot from %s, and the wait said %v", agent, err)
	}
}
