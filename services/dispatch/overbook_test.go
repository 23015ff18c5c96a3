package dispatch_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/clock"
	"github.com/berth-ci/berth/services/dispatch"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/nats-io/nkeys"
)

// Given a pool with one slot and a dispatcher that has just booked it (the
// reservation is stored but not yet folded back), when the job it booked for
// is cancelled, another queues, and the dispatcher decides again before its
// own fact comes back, then it books nothing more: its next booking must rest on a fold that counts the
// first, and the pool ledger's expected sequence is what says it does not.
// (Found by the 1,000-job replicas test: chaining the expected sequence onto
// its own last append let a second booking through.)
func TestADispatcherNeverBooksOnAFoldThatMissesItsOwnBooking(t *testing.T) {
	in := newIntake(t)
	d := newDispatcher(t, in, &countingMinter{}, dispatch.Options{})
	seq := uint64(1000) // facts folded by hand, not from the stream: none on a pool ledger
	apply := func(ps ...events.Payload) {
		for _, p := range ps {
			seq++
			e := events.New("test", time.Now(), p)
			e.Seq = seq
			deliver(d, e)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// An earlier booking, stored and folded, so the pool's ledger exists.
	app := &eventlog.Appender{JS: in.js, Source: "test"}
	earlier := events.AttemptRef{Attempt: events.AttemptID(9, 1), Pool: "linux", Host: "h-a"}
	var zero uint64
	for _, p := range []events.Payload{
		events.SlotReserved{Pool: "linux", Host: "h-a", Attempt: earlier.Attempt, JobID: 9, N: 1},
		events.SlotReleased{Pool: "linux", Host: "h-a", Attempt: earlier.Attempt, JobID: 9, Reason: "completed"},
	} {
		e := app.New(time.Now(), p)
		s, _, err := app.Append(ctx, e, &zero)
		if err != nil {
			t.Fatal(err)
		}
		zero = s
		folded, err := events.Unmarshal(mustMarshal(t, e), s)
		if err != nil {
			t.Fatal(err)
		}
		deliver(d, folded)
	}
	apply(host("h-a", 1, 1), queued(1))
	d.Decide(ctx) // books the one slot for job 1
	apply(completed(1, "", "cancelled"), queued(2))
	d.Decide(ctx) // job 1's reservation is not folded yet: the slot looks free

	if n := in.stream(t, events.PoolFilter("linux")).State.Msgs; n != 3 {
		t.Fatalf("%d slot facts on the linux ledger, want the earlier 2 and 1 reservation for its 1 slot", n)
	}
}

func mustMarshal(t *testing.T, e events.Event) []byte {
	t.Helper()
	b, err := events.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// mintRecorder records the runner names it was asked to mint for.
type mintRecorder struct {
	countingMinter
	names chan string
}

func (m *mintRecorder) Mint(ctx context.Context, r dispatch.MintRequest) (int64, string, error) {
	m.names <- r.RunnerName
	return m.countingMinter.Mint(ctx, r)
}

// Given a queued job and a free slot, when the dispatcher decides once,
// then it books the slot and mints the booked runner's JIT config in that
// same round: a booking it stored is in its fold at once, and waiting for
// it to come back through the consumer put a hop on every job's path to
// its runner (dispatch latency, issue 9).
func TestTheDispatcherMintsForItsBookingInTheSameRound(t *testing.T) {
	in := newIntake(t)
	m := &mintRecorder{names: make(chan string, 4)}
	d := newDispatcher(t, in, m, dispatch.Options{})
	for i, p := range []events.Payload{host("h-a", 1, 1), queued(1)} {
		e := events.New("test", time.Now(), p)
		e.Seq = uint64(i + 1)
		deliver(d, e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d.Decide(ctx) // the only Decide: nothing is folded back in between
	select {
	case name := <-m.names:
		if name != events.AttemptID(1, 1) {
			t.Errorf("minted for %s, want %s", name, events.AttemptID(1, 1))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no JIT config minted in the round that booked the slot")
	}
	if n := in.stream(t, events.PoolFilter("linux")).State.Msgs; n != 1 {
		t.Errorf("%d facts on the linux ledger, want the 1 booking", n)
	}
}

// blockingMinter holds every Mint until release is closed, counting the
// calls in flight and the most seen at once.
type blockingMinter struct {
	countingMinter
	release           chan struct{}
	inFlight, maxSeen atomic.Int64
	minted            atomic.Int64
}

func (m *blockingMinter) Mint(ctx context.Context, r dispatch.MintRequest) (int64, string, error) {
	n := m.inFlight.Add(1)
	for seen := m.maxSeen.Load(); n > seen && !m.maxSeen.CompareAndSwap(seen, n); seen = m.maxSeen.Load() {
	}
	defer m.inFlight.Add(-1)
	select {
	case <-m.release:
	case <-ctx.Done():
		return 0, "", ctx.Err()
	}
	m.minted.Add(1)
	return m.countingMinter.Mint(ctx, r)
}

// Given 12 queued jobs, 12 free slots and a GitHub that answers slowly,
// when the dispatcher decides, then at most MintConcurrency JIT-config
// calls are in flight at once (GitHub asks for mutating calls one at a
// time; unbounded, 10,000 at once timed out and their retries met 409),
// and the bookings left waiting are minted by later rounds.
func TestJITConfigCallsInFlightAreBounded(t *testing.T) {
	in := newIntake(t)
	m := &blockingMinter{release: make(chan struct{})}
	d := newDispatcher(t, in, m, dispatch.Options{MintConcurrency: 3})
	ps := []events.Payload{host("h-a", 12, 12)}
	for j := int64(1); j <= 12; j++ {
		ps = append(ps, queued(j))
	}
	for i, p := range ps {
		e := events.New("test", time.Now(), p)
		e.Seq = uint64(i + 1)
		deliver(d, e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d.Decide(ctx) // books all 12, starts what the bound allows
	testkit.Eventually(t, 5*time.Second, "3 JIT-config calls in flight", func() bool { return m.inFlight.Load() >= 3 })
	d.Decide(ctx) // a second round while the first calls hang
	// Calls the second round would start run off the loop: watch a while.
	testkit.Consistently(t, 50*time.Millisecond, "at most 3 JIT-config calls in flight", func() bool { return m.maxSeen.Load() <= 3 })
	if n := m.maxSeen.Load(); n != 3 {
		t.Fatalf("%d JIT-config calls in flight at most, want 3 (the bound)", n)
	}
	close(m.release)
	testkit.Eventually(t, 5*time.Second, "later rounds mint all 12", func() bool {
		d.Decide(ctx)
		return m.minted.Load() >= 12
	})
	if n := m.minted.Load(); n != 12 {
		t.Errorf("%d of 12 bookings minted after the calls returned", n)
	}
	if n := m.maxSeen.Load(); n > 3 {
		t.Errorf("%d JIT-config calls in flight at most, want at most 3", n)
	}
}

// Given a booking whose JIT config GitHub has returned, while its placement
// waits on a loop too busy to run it (the 500-host scale run), when later
// rounds decide, past the time a mint is trusted to be in flight, then the
// runner is not minted again (GitHub answers a second call for the name
// with 409, and those retries used up the API budget) and a round stores
// the placement the first call produced.
func TestAMintWhosePlacementWaitsIsNeverMintedTwice(t *testing.T) {
	in := newIntake(t)
	m := &mintRecorder{names: make(chan string, 4)}
	t0 := time.Now()
	clk := clock.NewFake(t0)
	// The loop never runs: what the mint posts to it waits forever.
	d := newDispatcher(t, in, m, dispatch.Options{Now: clk.Now})
	kp, err := nkeys.CreateCurveKeys()
	if err != nil {
		t.Fatal(err)
	}
	h := host("h-a", 1, 1)
	h.CurveKey, _ = kp.PublicKey() // the placement is sealed to it
	for i, p := range []events.Payload{h, queued(1)} {
		e := events.New("test", t0, p)
		e.Seq = uint64(i + 1)
		deliver(d, e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d.Decide(ctx)
	select {
	case <-m.names:
	case <-ctx.Done():
		t.Fatal("no JIT config minted for the booking")
	}
	placements := func() uint64 {
		return in.stream(t, events.AttemptFilter("h-a", attempt(1, 1))).State.Subjects[events.AttemptSubject("h-a", attempt(1, 1))+".dispatcher"]
	}
	testkit.Eventually(t, 5*time.Second, "the minted placement stored by a later round", func() bool {
		if placements() > 0 {
			return true
		}
		clk.Advance(3 * time.Second) // past the 10 s in-flight mark within a few rounds
		d.Decide(ctx)
		return false
	})
	for range 5 {
		clk.Advance(11 * time.Second)
		d.Decide(ctx)
	}
	select {
	case name := <-m.names:
		t.Fatalf("%s minted a second time", name)
	case <-time.After(100 * time.Millisecond):
	}
}

// Given a booking whose JIT config was minted and sealed, when the fold
// shows its placement, then the next round drops the minted placement
// from memory, and the mint call's in-flight mark with it: a sealed
// runner credential and its fact stayed until the
// minute's housekeeping, so a finished job's memory was a minute of
// placements, not a few bytes (issue 19).
func TestAMintedPlacementLeavesMemoryInTheRoundItsPlacementIsFolded(t *testing.T) {
	in := newIntake(t)
	d := newDispatcher(t, in, &countingMinter{}, dispatch.Options{})
	agent, err := nkeys.CreateCurveKeys() // the host's key, so the JIT config can be sealed to it
	if err != nil {
		t.Fatal(err)
	}
	h := host("h-a", 1, 1)
	if h.CurveKey, err = agent.PublicKey(); err != nil {
		t.Fatal(err)
	}
	for i, p := range []events.Payload{h, queued(1)} {
		e := events.New("test", time.Now(), p)
		e.Seq = uint64(i + 1)
		deliver(d, e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d.Decide(ctx) // books, mints and seals; the housekeeping of this first round is done
	testkit.Poll(t, ctx, 5*time.Second, time.Millisecond, "the minted placement kept until it is placed", func(context.Context) error {
		if n := d.MintedCount(); n != 1 {
			return fmt.Errorf("%d minted placements kept", n)
		}
		return nil
	})
	placed := events.New("test", time.Now(), &events.AttemptPlaced{
		AttemptRef: events.AttemptRef{Attempt: events.AttemptID(1, 1), Pool: "linux", Host: "h-a"}, JobID: 1, Labels: []string{"self-hosted", "linux"}})
	placed.Seq = 4
	deliver(d, placed)
	d.Decide(ctx)
	if n := d.MintedCount(); n != 0 {
		t.Errorf("%d minted placements kept after the fold showed the placement, want 0", n)
	}
	if key := (dispatch.MintCall{Attempt: events.AttemptID(1, 1)}).CallKey(); d.InFlight(key) {
		t.Errorf("the mint call's in-flight mark %s kept after the fold showed the placement", key)
	}
}
