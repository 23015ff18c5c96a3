package watchdog_test

import (
	"context"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/services/watchdog"
)

// Given a slot booked on a host and a watchdog whose delivery NATS holds
// back (its durable consumer paused, as while a cluster elects a leader),
// when the agent's RunnerStarted is stored before the provisioning
// deadline and the watchdog's clock then passes the deadline, then
// nothing is released while the watchdog has not folded the log up to
// where it ended; and once delivery resumes the runner is seen and
// nothing is released at all. Before, the release was decided on the
// fold as it stood, and charged to the host: a fault of NATS counted
// against a host (law 11).
func TestADeadlineIsJudgedOnlyOnAFoldThatReachedTheLogsEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now().UTC()
	js, app, fake, booked := bookedLog(ctx, t, start, start, 9)
	const tick = 15 * time.Minute
	const name = "test-watchdog"
	w, stop := runWatchdogWith(ctx, t, js, app, fake, tick, func(w *watchdog.Watchdog) {
		w.Loop.Consumer = &eventlog.Consumer{Name: name, StallAfter: time.Hour} // no recreation undoes the pause
	})
	defer stop()
	testkit.Eventually(t, 20*time.Second, "the watchdog caught up with the log", w.Loop.CaughtUp)
	if err := w.Read(ctx, func(*events.Fleet) {}); err != nil {
		t.Fatal(err)
	}

	// NATS holds the watchdog's delivery; the runner starts in time.
	if _, err := js.PauseConsumer(ctx, events.StreamName, name, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	ref := events.AttemptRef{Attempt: booked.Attempt, Pool: booked.Pool, Host: booked.Host}
	seq, _, err := app.Append(ctx, app.New(start, events.AttemptRunnerStarted{AttemptRef: ref}), nil)
	if err != nil {
		t.Fatal(err)
	}

	// The deadline passes on the watchdog's clock: it reads where the log
	// ends, and holds the release while its fold is short of it.
	fake.Advance(tick)
	testkit.Eventually(t, 20*time.Second, "the watchdog judged the deadline: read where the log ends, or released", func() bool {
		end, err := watchdog.MarkedEnd(ctx, w)
		return err == nil && end >= seq || releasedIn(ctx, t, js, booked.Pool, booked.Attempt) != nil
	})
	if err := w.Read(ctx, func(*events.Fleet) {}); err != nil { // a whole turn with the end known
		t.Fatal(err)
	}
	if r := releasedIn(ctx, t, js, booked.Pool, booked.Attempt); r != nil {
		t.Fatalf("released for %s while the watchdog's fold was short of the runner's start stored at seq %d", r.reason, seq)
	}

	// Delivery resumes: the runner's start is folded and nothing is released.
	if _, err := js.ResumeConsumer(ctx, events.StreamName, name); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "the watchdog folded the runner's start", func() bool {
		started := false
		if err := w.Read(ctx, func(f *events.Fleet) {
			started = f.Attempts[booked.Attempt] != nil && f.Attempts[booked.Attempt].RunnerStarted
		}); err != nil {
			t.Fatal(err)
		}
		return started
	})
	fake.Advance(time.Second)
	if err := w.Read(ctx, func(*events.Fleet) {}); err != nil {
		t.Fatal(err)
	}
	if r := releasedIn(ctx, t, js, booked.Pool, booked.Attempt); r != nil {
		t.Fatalf("released for %s a runner that started in time", r.reason)
	}
}
