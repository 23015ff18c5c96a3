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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, app, kv := heartbeatLog(ctx, t)
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

// heartbeatLog is a log, an appender and the heartbeat bucket, on an
// embedded server of the test's own.
func heartbeatLog(ctx context.Context, t *testing.T) (jetstream.JetStream, *eventlog.Appender, jetstream.KeyValue) {
	t.Helper()
	js, app := testkit.Log(t, "test")
	kv, err := eventlog.HeartbeatKV(ctx, js, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	return js, app, kv
}

// refusing is a heartbeat bucket that takes no writes, as while its
// replicas have no leader.
type refusing struct{ jetstream.KeyValue }

func (refusing) Put(context.Context, string, []byte) (uint64, error) {
	return 0, errors.New("nats: no response from stream")
}

// Given a heartbeat bucket that takes no writes, when the watchdog's probe
// writes to it, then the watchdog records a fault of NATS at that moment
// on its clock (Loop.LastFault), which a provisioning or registration
// deadline running across it is charged to (culprit), not the host.
func TestAProbeWriteTheBucketRefusesIsAFaultOfNATS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, app, kv := heartbeatLog(ctx, t)
	at := time.Date(2026, 12, 7, 3, 0, 0, 0, time.UTC)
	w := New(js, app, Params{}, clock.NewFake(at), slog.New(slog.NewTextHandler(io.Discard, nil)))
	pctx, stop := context.WithCancel(ctx)
	w.wg.Add(1)
	go w.probeHeartbeats(pctx, refusing{kv})
	defer func() { stop(); w.wg.Wait() }()
	testkit.Eventually(t, 10*time.Second, "the refused probe recorded as a fault of NATS", func() bool {
		return w.Loop.LastFault().Equal(at)
	})
}
