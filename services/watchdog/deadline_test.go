package watchdog_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/clock"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/services/watchdog"
	"github.com/nats-io/nats.go/jetstream"
)

// Given a slot booked on a host whose runner never starts, when a fake
// clock is advanced past the provisioning deadline, then the real loop
// (real NATS, real consumer, the loop's own ticker on the fake clock)
// releases the slot for that reason, stamped at or after the deadline: the
// deadline was driven by the clock, with no sleep and no wall-clock wait.
func TestAFakeClockDrivesTheProvisioningDeadlineThroughTheRealLoop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	js, app, fake, booked := bookedLog(ctx, t, start, start, 7)
	const tick = time.Hour
	w, stop := runWatchdog(ctx, t, js, app, fake, tick)
	defer stop()

	// When the watchdog has caught up and decided on the history at the
	// start time, nothing is released.
	testkit.Eventually(t, 20*time.Second, "the watchdog caught up with the log", w.Loop.CaughtUp)
	if err := w.Read(ctx, func(*events.Fleet) {}); err != nil { // one whole turn after catching up
		t.Fatal(err)
	}
	if a := releasedIn(ctx, t, js, booked.Pool, booked.Attempt); a != nil {
		t.Fatalf("released before the deadline: %s at %v", a.reason, a.at)
	}

	// Then, with the fake clock moved to the loop's next tick, an hour on
	// (past the deadline; on the wall clock the tick is an hour away, so
	// only the fake clock's ticker can decide in time), the slot goes back.
	fake.Advance(tick)
	var got *releasedAt
	testkit.Eventually(t, 20*time.Second, "the slot released after the fake clock passed the deadline", func() bool {
		got = releasedIn(ctx, t, js, booked.Pool, booked.Attempt)
		return got != nil
	})
	if got.reason != events.ReleaseProvisionTimeout {
		t.Fatalf("released for %q, want %q", got.reason, events.ReleaseProvisionTimeout)
	}
	if got.at.Before(start.Add(tick)) {
		t.Fatalf("release stamped %v, before the tick at %v: not the fake clock's decision", got.at, start.Add(tick))
	}
}

// runWatchdog runs a watchdog (provisioning deadline 10 min) on the log
// with the fake clock, its loop ticking every tick; stop ends it.
func runWatchdog(ctx context.Context, t *testing.T, js jetstream.JetStream, app *eventlog.Appender, fake *clock.Fake, tick time.Duration) (*watchdog.Watchdog, func()) {
	t.Helper()
	return runWatchdogWith(ctx, t, js, app, fake, tick, nil)
}

// runWatchdogWith is runWatchdog with tune applied before the watchdog runs.
func runWatchdogWith(ctx context.Context, t *testing.T, js jetstream.JetStream, app *eventlog.Appender, fake *clock.Fake, tick time.Duration, tune func(*watchdog.Watchdog)) (*watchdog.Watchdog, func()) {
	t.Helper()
	p := watchdog.Params{ProvisionTimeout: 10 * time.Minute, HostTTL: 24 * time.Hour, TeardownTimeout: time.Hour}
	w := watchdog.New(js, app, p, fake, slog.New(slog.NewTextHandler(io.Discard, nil)))
	w.Loop.Tick = tick
	if tune != nil {
		tune(w)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(rctx) }()
	return w, func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// Found attacking the landed code (issue 16, F10): a fact's time was the
// writer's word. Given a booking whose writer's clock runs an hour ahead
// (stamped an hour after the log stored it), when the watchdog's clock
// passes the provisioning deadline counted from when the log stored it,
// then the slot is released; before, the deadline ran from the writer's
// stamp, an hour later, and the slot stayed held.
func TestADeadlineRunsFromWhenTheLogStoredTheFactNotTheWritersClock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now().UTC()
	js, app, fake, booked := bookedLog(ctx, t, start, start.Add(time.Hour), 8) // the writer's clock: an hour ahead
	const tick = 15 * time.Minute
	w, stop := runWatchdog(ctx, t, js, app, fake, tick)
	defer stop()
	testkit.Eventually(t, 20*time.Second, "the watchdog caught up with the log", w.Loop.CaughtUp)
	fake.Advance(tick) // 15 min after the log stored the booking: past its 10 min deadline
	var got *releasedAt
	testkit.Eventually(t, 20*time.Second, "the slot released 15 min after the log stored its booking", func() bool {
		if err := w.Read(ctx, func(*events.Fleet) {}); err != nil { // one whole turn
			t.Fatal(err)
		}
		got = releasedIn(ctx, t, js, booked.Pool, booked.Attempt)
		return got != nil
	})
	if got.reason != events.ReleaseProvisionTimeout {
		t.Fatalf("released for %q, want %q", got.reason, events.ReleaseProvisionTimeout)
	}
}

// bookedLog starts a log holding a host (2 linux slots) that announced
// itself at start, job jobID queued, and its first attempt booked there,
// the booking stamped bookedAt by its writer; the fake clock reads start.
func bookedLog(ctx context.Context, t *testing.T, start, bookedAt time.Time, jobID int64) (jetstream.JetStream, *eventlog.Appender, *clock.Fake, events.SlotReserved) {
	t.Helper()
	_, js, _ := testkit.NATS(t)
	if _, err := eventlog.EnsureStream(ctx, js, eventlog.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	app := &eventlog.Appender{JS: js, Source: "test"}
	booked := events.SlotReserved{Pool: "linux", Host: "h-a", Attempt: events.AttemptID(jobID, 1), JobID: jobID, N: 1, Labels: []string{"linux"}}
	for _, f := range []struct {
		at time.Time
		p  events.Payload
	}{
		{start, events.HostOnline{Host: "h-a", Boot: "b", PhysicalCap: 2, At: start, CurveKey: "X",
			Pools: map[string]events.PoolSlots{"linux": {Slots: 2, Labels: []string{"linux"}}}}},
		{start, events.JobQueued{JobRef: events.JobRef{JobID: jobID, Labels: []string{"linux"}}}},
		{bookedAt, booked},
	} {
		if _, _, err := app.Append(ctx, app.New(f.at, f.p), nil); err != nil {
			t.Fatal(err)
		}
	}
	return js, app, clock.NewFake(start), booked
}

// releasedIn returns the slot release of attempt if it is the newest fact
// on its pool's ledger, or nil. It reads the log, not the watchdog (a read
// through the loop would itself make the loop decide).
func releasedIn(ctx context.Context, t *testing.T, js jetstream.JetStream, pool, attempt string) *releasedAt {
	t.Helper()
	s, err := js.Stream(ctx, events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, events.PoolFilter(pool))
	if err != nil {
		t.Fatal(err)
	}
	ev, err := events.Unmarshal(m.Data, m.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := ev.Data.(*events.SlotReleased); ok && r.Attempt == attempt {
		return &releasedAt{reason: r.Reason, at: ev.Time}
	}
	return nil
}

type releasedAt struct {
	reason string
	at     time.Time
}
