package eventlog_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
)

// decideRecorder records how many facts the fold held at each Decide.
type decideRecorder struct {
	mu      sync.Mutex
	applied int
	seen    []int
}

func (r *decideRecorder) Apply(d eventlog.Delivered) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.applied++
}

func (r *decideRecorder) Decide(context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, r.applied)
}

// Given a log holding facts a loop's filter matches (an agent's host
// subjects among others), when the loop starts and its first delivery takes
// longer than a few ticks, then Decide is not called until the fold holds
// every matching fact the log held at start. (Found by the chaos run: an
// agent restarted during a NATS outage took a silent consumer for "caught
// up", then decided on a fold holding an attempt's placement but not its
// later facts, and created a VM that had been created and stopped before.)
func TestDecideWaitsForEveryFactTheLogHeldAtStart(t *testing.T) {
	_, js, app := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	const host, matching = "host-a", 1500
	for i := range matching {
		ref := events.AttemptRef{Attempt: events.AttemptID(int64(i+1), 1), Pool: "linux", Host: host}
		for _, p := range []events.Payload{events.AttemptProvisioning{AttemptRef: ref}, events.JobQueued{JobRef: events.JobRef{
			Delivery: fmt.Sprintf("d-%d", i), JobID: int64(i + 1), Labels: []string{"linux"}}}} {
			if _, _, err := app.Append(ctx, app.New(time.Now(), p), nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	r := &decideRecorder{}
	// A 1 ms tick: many ticks pass before the first delivery arrives.
	loop := &eventlog.Loop{JS: js, Filters: []string{events.HostAttemptsFilter(host)}, Tick: time.Millisecond}
	lctx, lcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- loop.Run(lctx, r) }()
	waitFor(t, "the loop caught up", loop.CaughtUp)
	waitFor(t, "a Decide after catching up", func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.seen) > 0 })
	lcancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen[0] < matching {
		t.Fatalf("the first Decide saw %d of the %d matching facts the log held at start (Decide calls saw %v…)",
			r.seen[0], matching, r.seen[:min(len(r.seen), 5)])
	}
}
