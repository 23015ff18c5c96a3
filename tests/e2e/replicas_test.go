package e2e

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/run"
	"github.com/berth-ci/berth/tests/harness"
)

// Given three dispatcher replicas folding the same log (webhooks reach one;
// all of them decide), when a burst of jobs arrives, then per-pool
// optimistic concurrency and deterministic attempt ids keep them from
// over-booking: held never exceeds capacity, every reservation is stored
// once, every job is served exactly once, and nothing is left held.
func TestThreeDispatchersNeverOverbook(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	o := demoOptions(t, 120)
	o.Arrival = time.Second
	f, err := harness.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	extra, stopExtra := context.WithCancel(ctx)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for range 2 {
		cfg := *f.Config
		cfg.Dispatcher.Listen = "127.0.0.1:0"
		if _, _, err := run.Dispatcher(extra, f.Sys, &cfg, quiet); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := f.Drive(ctx, o)
	stopExtra()
	if err != nil {
		f.Stop()
		t.Fatal(err)
	}
	reservations, releases := countSlotFacts(t, ctx, f.Sys.NATSURL)
	if err := f.Stop(); err != nil {
		t.Errorf("shutdown: %v", err)
	}
	if rep.Served != o.Jobs || rep.Failed != 0 || rep.SlotsHeld != 0 || rep.VMsAlive != 0 {
		t.Errorf("served %d of %d (%d not), %d slots held, %d VMs alive", rep.Served, o.Jobs, rep.Failed, rep.SlotsHeld, rep.VMsAlive)
	}
	if len(rep.Violations) != 0 {
		t.Errorf("invariants: %v", rep.Violations)
	}
	for a, n := range reservations {
		if n != 1 {
			t.Errorf("attempt %s reserved %d times", a, n)
		}
		if releases[a] != 1 {
			t.Errorf("attempt %s released %d times", a, releases[a])
		}
	}
	if !rep.ReplayEqual {
		t.Errorf("replay differs: %s", rep.ReplayDiff)
	}
}

// countSlotFacts reads every pool ledger and counts reservations and
// releases per attempt, as stored.
func countSlotFacts(t *testing.T, ctx context.Context, url string) (map[string]int, map[string]int) {
	t.Helper()
	nc, js, err := eventlog.Connect(url, "count")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	last, err := eventlog.LastSeq(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	res, rel := map[string]int{}, map[string]int{}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := make(chan eventlog.Delivered, 256)
	go eventlog.Follow(cctx, js, []string{events.SubjectAll}, 1, ch)
	for {
		select {
		case d := <-ch:
			switch p := d.Event.Data.(type) {
			case *events.SlotReserved:
				res[p.Attempt]++
			case *events.SlotReleased:
				rel[p.Attempt]++
			}
			if d.Event.Seq >= last {
				return res, rel
			}
		case <-time.After(10 * time.Second):
			t.Fatal("reading the log stalled")
		}
	}
}
