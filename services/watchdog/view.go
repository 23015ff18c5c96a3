package watchdog

import (
	"context"
	"slices"
	"time"

	"github.com/berth-ci/berth/events"
)

// The watchdog's releases and abandons judge an absence: no runner by the
// provisioning deadline, no job by the registration deadline, no stop by
// the teardown deadline. Such a judgment stands only on a fold that holds
// every fact stored before it was made (law 11: act on the whole view).
// When NATS delays the watchdog's delivery (a leader election, a consumer
// being recreated) its fold falls behind the log while its clock runs on;
// judged then, an agent's RunnerStarted stored in time reads as absent,
// and the release charges the host for a fault of NATS.
//
// So a judgment is held from the round that first makes it until the
// watchdog has read where the log ends, at that moment or later (a direct
// get of the newest fact, off the loop), and folded up to there. On a
// quiet log that costs one read and one more round; a fold that lags holds
// the judgment until it catches up, and a log that does not answer holds
// it until it does. Each round decides again from the fold, so a judgment
// the late facts undo is never acted on.

// logMark is where the log ended when the watchdog last read it.
type logMark struct {
	end     uint64    // the newest sequence the watchdog's filters matched
	at      time.Time // when the read began, on the watchdog's clock
	reading bool      // a read is on its way
}

// holdUnseen removes from plan each release (with its teardown) and each
// abandon until the log's end was read at or after the round that first
// made it, and the fold has reached that end; it starts that read when one
// is needed.
func (w *Watchdog) holdUnseen(ctx context.Context, plan *Plan, now time.Time) {
	if len(plan.Release) == 0 && len(plan.Abandon) == 0 {
		w.judged = nil
		return
	}
	judged := make(map[string]time.Time, len(plan.Release)+len(plan.Abandon))
	folded := w.Loop.LastSeq() >= w.mark.end
	stale := false // a judgment is newer than the last read
	ready := func(key string) bool {
		first, ok := w.judged[key]
		if !ok {
			first = now
		}
		judged[key] = first
		if w.mark.at.IsZero() || w.mark.at.Before(first) {
			stale = true
			return false
		}
		return folded
	}
	held := map[string]bool{}
	plan.Release = slices.DeleteFunc(plan.Release, func(r events.SlotReleased) bool {
		if ready("release " + r.Reason + " " + r.Attempt) {
			return false
		}
		held[r.Attempt] = true
		return true
	})
	plan.Teardown = slices.DeleteFunc(plan.Teardown, func(t events.AttemptTeardownRequested) bool { return held[t.Attempt] })
	plan.Abandon = slices.DeleteFunc(plan.Abandon, func(a events.AttemptAbandoned) bool { return !ready("abandon " + a.Attempt) })
	w.judged = judged
	if stale && !w.mark.reading {
		w.readEnd(ctx)
	}
}

// readEnd reads where the log ends off the loop and posts it back, which
// brings a round that acts on what was held. A read that fails is logged
// and asked again by the next round that holds a judgment.
func (w *Watchdog) readEnd(ctx context.Context) {
	w.mark.reading = true
	at := w.Now()
	go func() {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		end, err := w.Loop.LogEnd(rctx)
		cancel()
		w.Loop.Post(ctx, func() {
			w.mark.reading = false
			if err != nil {
				w.Loop.NoteFault(at)
				w.logger.Warn("could not read where the log ends; releases and abandons judged on deadlines wait until it answers",
					"err", err)
				return
			}
			w.mark.end, w.mark.at = end, at
		})
	}()
}
