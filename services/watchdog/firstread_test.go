package watchdog

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/clock"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
)

// unanswering is a heartbeat bucket whose key listing fails the first
// fails times, as during a NATS leader election.
type unanswering struct {
	jetstream.KeyValue
	fails int
}

func (u *unanswering) ListKeys(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyLister, error) {
	if u.fails > 0 {
		u.fails--
		return nil, context.DeadlineExceeded
	}
	return u.KeyValue.ListKeys(ctx, opts...)
}

// Given a heartbeat bucket that does not answer at the watchdog's start
// (twice), when the watchdog reads the heartbeats before its first
// decision, then it tries again on its clock instead of exiting (a chaos
// run's watchdog exited on a NATS election), and once the read succeeds
// it has seen the host's heartbeat.
func TestTheFirstHeartbeatReadWaitsForNATSInsteadOfExiting(t *testing.T) {
	js, app := testkit.Log(t, "test")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := eventlog.HeartbeatKV(ctx, js, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	hb, _ := json.Marshal(events.Heartbeat{Host: "host-a", Boot: "b1", At: time.Now().UTC()})
	if _, err := kv.Put(ctx, "host-a", hb); err != nil {
		t.Fatal(err)
	}
	fake := clock.NewFake(time.Now())
	w := New(js, app, Params{}, fake, slog.New(slog.NewTextHandler(io.Discard, nil)))
	done := make(chan error, 1)
	go func() { done <- w.firstRead(ctx, &unanswering{KeyValue: kv, fails: 2}) }()
	for range 2 { // each failed read waits on the fake clock
		testkit.Eventually(t, 10*time.Second, "the retry waits on the clock", func() bool { return fake.Timers() > 0 })
		fake.Advance(5 * time.Second)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("first read: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the first read did not end")
	}
	if HeardRevision(w, "host-a") == 0 {
		t.Fatal("the heartbeat stored before the start was not seen")
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("test deadline passed")
	}
}
