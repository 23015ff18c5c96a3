package eventlog_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/natsembed"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/nats-io/nats.go/jetstream"
)

// startSmall runs an embedded server whose messages may hold at most
// maxPayload bytes, with the Berth stream and the snapshot bucket.
func startSmall(t *testing.T, maxPayload int32) (jetstream.JetStream, jetstream.KeyValue, *eventlog.Appender) {
	t.Helper()
	_, js, app := startServer(t, natsembed.EmbeddedConfig{MaxPayload: maxPayload}, eventlog.StreamConfig{})
	kv, err := js.CreateOrUpdateKeyValue(ctxFor(t), jetstream.KeyValueConfig{Bucket: events.BucketSnapshots, History: 1})
	if err != nil {
		t.Fatal(err)
	}
	return js, kv, app
}

// Given a server whose messages hold at most 16 KiB, when a snapshot far
// larger (and incompressible) is stored, then it reads back whole from its
// parts; a smaller snapshot stored after it removes the old parts; and a
// part that was changed makes the read fail (the caller replays the log)
// instead of restoring a wrong fold.
func TestASnapshotLargerThanAMessageIsStoredInParts(t *testing.T) {
	js, kv, _ := startSmall(t, 16<<10)
	ctx := ctxFor(t)
	big := make([]byte, 100<<10)
	for i := range big {
		big[i] = byte(rand.IntN(256))
	}
	if err := eventlog.PutSnapshot(ctx, js, kv, "dispatcher", 7, big); err != nil {
		t.Fatalf("storing a 100 KiB snapshot with 16 KiB messages: %v", err)
	}
	got, err := eventlog.GetSnapshot(ctx, kv, "dispatcher")
	if err != nil || string(got) != string(big) {
		t.Fatalf("read back %d bytes (err %v), want the %d stored", len(got), err, len(big))
	}
	parts := keysWithPrefix(t, kv, "dispatcher.g7.")
	if len(parts) < 7 {
		t.Fatalf("parts %v, want at least 7 of at most 16 KiB for 100 KiB", parts)
	}

	small := []byte(`{"version":1}`)
	if err := eventlog.PutSnapshot(ctx, js, kv, "dispatcher", 9, small); err != nil {
		t.Fatal(err)
	}
	if got, err := eventlog.GetSnapshot(ctx, kv, "dispatcher"); err != nil || string(got) != string(small) {
		t.Fatalf("read back %q (err %v), want %q", got, err, small)
	}
	if left := keysWithPrefix(t, kv, "dispatcher.g"); len(left) != 0 {
		t.Errorf("parts of the replaced snapshot left behind: %v", left)
	}

	if err := eventlog.PutSnapshot(ctx, js, kv, "dispatcher", 11, big); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "dispatcher.g11.2", []byte("not the part that was stored")); err != nil {
		t.Fatal(err)
	}
	if _, err := eventlog.GetSnapshot(ctx, kv, "dispatcher"); err == nil || !strings.Contains(err.Error(), "digest") {
		t.Errorf("a changed part read as %v, want an error about the digest", err)
	}
	if _, err := eventlog.GetSnapshot(ctx, kv, "watchdog"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("a key never stored: %v, want ErrKeyNotFound", err)
	}
}

func keysWithPrefix(t *testing.T, kv jetstream.KeyValue, prefix string) []string {
	t.Helper()
	keys, err := kv.Keys(ctxFor(t))
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		t.Fatal(err)
	}
	var out []string
	for _, k := range keys {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	return out
}

// Given a fold whose snapshot is larger than one message (found by the
// bench: a dispatcher's fold of 2,000 jobs passed the 4 MiB the embedded
// server allows, and every save failed), when the service restarts, then
// it restores that snapshot and folds only the tail.
func TestAFoldLargerThanAMessageRestartsFromItsSnapshot(t *testing.T) {
	js, kv, app := startSmall(t, 16<<10)
	ctx := ctxFor(t)
	const jobs = 400
	for id := int64(1); id <= jobs; id++ {
		ev := app.New(time.Now(), events.JobQueued{JobRef: events.JobRef{JobID: id, Delivery: fmt.Sprintf("delivery-%d-%x", id, rand.Uint64()),
			Org: "example-org", Repo: fmt.Sprintf("repo-%x", rand.Uint64()), Labels: []string{"self-hosted", fmt.Sprintf("l-%x", rand.Uint64())}}})
		if _, _, err := app.Append(ctx, ev, nil); err != nil {
			t.Fatal(err)
		}
	}
	first := &foldReactor{fleet: events.NewFleet()}
	l1 := &eventlog.Loop{JS: js, Filters: []string{events.SubjectAll}, Tick: 20 * time.Millisecond,
		SnapshotKey: "test", SnapshotEvery: 20 * time.Millisecond}
	stop1 := runStoppable(t, l1, first)
	testkit.Eventually(t, waitLimit, "a snapshot covering every job", func() bool {
		b, err := eventlog.GetSnapshot(ctx, kv, "test")
		if err != nil {
			return false
		}
		f, err := events.UnmarshalSnapshot(b)
		return err == nil && len(f.Jobs) == jobs
	})
	stop1()
	if parts := keysWithPrefix(t, kv, "test.g"); len(parts) < 2 {
		t.Fatalf("the snapshot was stored in %d parts; the test needs a fold larger than one message", len(parts))
	}
	second := &foldReactor{fleet: events.NewFleet()}
	runLoop(t, &eventlog.Loop{JS: js, Filters: []string{events.SubjectAll}, Tick: 20 * time.Millisecond, SnapshotKey: "test"}, second)
	testkit.Eventually(t, waitLimit, "the restarted fold holds every job", func() bool {
		second.mu.Lock()
		defer second.mu.Unlock()
		return len(second.fleet.Jobs) == jobs
	})
	second.mu.Lock()
	defer second.mu.Unlock()
	if second.applied != 0 {
		t.Errorf("the restart folded %d facts, want 0: the snapshot covers them all", second.applied)
	}
}

// runStoppable runs l and returns a stop that ends it and fails the test
// if it returned an error; the test's cleanup stops it too.
func runStoppable(t *testing.T, l *eventlog.Loop, r eventlog.Reactor) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx, r) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("loop: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// Given a server that takes messages of 4 MiB (the embedded default), when
// a snapshot of 1 MiB that gzip cannot shrink is stored, then it goes in
// parts of at most 256 KiB (the client keeps a write buffer the size of
// the largest message it sent) and reads back whole.
func TestASnapshotGoesInPartsSmallEnoughNotToSwellTheClientsBuffer(t *testing.T) {
	js, kv, _ := startSmall(t, 4<<20)
	ctx := ctxFor(t)
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(rand.IntN(256))
	}
	if err := eventlog.PutSnapshot(ctx, js, kv, "dispatcher", 3, big); err != nil {
		t.Fatal(err)
	}
	for _, k := range keysWithPrefix(t, kv, "dispatcher.g3.") {
		e, err := kv.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if len(e.Value()) > 256<<10 {
			t.Errorf("part %s holds %d bytes, more than 256 KiB", k, len(e.Value()))
		}
	}
	if got, err := eventlog.GetSnapshot(ctx, kv, "dispatcher"); err != nil || string(got) != string(big) {
		t.Fatalf("read back %d bytes (err %v), want the %d stored", len(got), err, len(big))
	}
	if parts := keysWithPrefix(t, kv, "dispatcher.g3."); len(parts) < 4 {
		t.Fatalf("parts %v, want at least 4 for 1 MiB", parts)
	}
}
