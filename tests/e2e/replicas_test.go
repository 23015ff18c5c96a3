package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/run"
	"github.com/berth-ci/berth/tests/harness"
)

// Given three dispatcher replicas folding the same log (webhooks reach one;
// all of them decide), when 1,000 jobs arrive at once, then per-pool
// optimistic concurrency and deterministic attempt ids keep them from
// over-booking: held never exceeds capacity, every reservation is stored
// once, every job is served exactly once, and nothing is left held.
func TestThreeDispatchersNeverOverbook(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	o := demoOptions(t, jobsFromEnv(1000))
	o.Arrival = time.Second // all 1,000 webhooks within one second
	o.Timeout = 5 * time.Minute
	f, err := harness.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	extra, stopExtra := context.WithCancel(ctx)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i := range 2 {
		cfg := *f.Config
		cfg.Dispatcher.Listen = "127.0.0.1:0"
		cfg.Instance = fmt.Sprintf("extra-%d", i) // each replica its own consumer
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
	reservations, releases, peak, peakAt := countSlotFacts(t, ctx, f.Sys.NATSURL)
	st, err := f.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Stop(); err != nil {
		t.Errorf("shutdown: %v", err)
	}
	if rep.Served != o.Jobs || rep.Failed != 0 || rep.SlotsHeld != 0 || rep.VMsAlive != 0 {
		t.Errorf("served %d of %d (%d not), %d slots held, %d VMs alive", rep.Served, o.Jobs, rep.Failed, rep.SlotsHeld, rep.VMsAlive)
	}
	if len(rep.Violations) != 0 {
		t.Errorf("invariants: %v", rep.Violations)
	}
	for _, p := range st.Pools {
		if peak[p.Name] > p.Capacity || peak[p.Name] == 0 {
			t.Errorf("pool %s held %d slots at once (%s), capacity %d", p.Name, peak[p.Name], peakAt[p.Name], p.Capacity)
		}
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
// releases per attempt, as stored, and the most slots each pool held at
// once in stream order.
func countSlotFacts(t *testing.T, ctx context.Context, url string) (res, rel map[string]int, peak map[string]int, peakAt map[string]string) {
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
	res, rel, peak = map[string]int{}, map[string]int{}, map[string]int{}
	held := map[string]map[string]bool{} // pool → attempts holding a slot
	peakAt = map[string]string{}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := make(chan eventlog.Delivered, 256)
	go eventlog.Follow(cctx, js, "test-replicas-follow", []string{events.SubjectAll}, 1, ch)
	for {
		select {
		case d := <-ch:
			switch p := d.Event.Data.(type) {
			case *events.SlotReserved:
				res[p.Attempt]++
				if held[p.Pool] == nil {
					held[p.Pool] = map[string]bool{}
				}
				if rel[p.Attempt] == 0 {
					held[p.Pool][p.Attempt] = true
				}
				if len(held[p.Pool]) > peak[p.Pool] {
					peak[p.Pool] = len(held[p.Pool])
					peakAt[p.Pool] = fmt.Sprintf("seq %d, held by %v", d.Event.Seq, keys(held[p.Pool]))
				}
			case *events.SlotReleased:
				rel[p.Attempt]++
				delete(held[p.Pool], p.Attempt)
			}
			if d.Event.Seq >= last {
				return res, rel, peak, peakAt
			}
		case <-time.After(10 * time.Second):
			t.Fatal("reading the log stalled")
		}
	}
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// jobsFromEnv reads BERTH_REPLICAS_JOBS; without it the run is def jobs,
// or 200 under the race detector (make test runs the full size without it).
func jobsFromEnv(def int) int {
	if n, err := strconv.Atoi(os.Getenv("BERTH_REPLICAS_JOBS")); err == nil && n > 0 {
		return n
	}
	if raceEnabled {
		return 200
	}
	return def
}
