package eventlog_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
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
	testkit.Eventually(t, waitLimit, "the loop caught up", loop.CaughtUp)
	testkit.Eventually(t, waitLimit, "a Decide after catching up", func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.seen) > 0 })
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

// gapReactor records how many facts the fold held at each Decide.
type gapReactor struct {
	mu      sync.Mutex
	applied int
	seen    []int
}

func (r *gapReactor) Apply(eventlog.Delivered) { r.mu.Lock(); r.applied++; r.mu.Unlock() }
func (r *gapReactor) Decide(context.Context) {
	r.mu.Lock()
	r.seen = append(r.seen, r.applied)
	r.mu.Unlock()
}

func (r *gapReactor) decides() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.seen...)
}

// Given a loop with a Gap (the watchdog's) on a durable consumer, when a
// burst of facts arrives one at a time, then they are decided on together,
// not one Decide each: at most one Decide per gap (plus the one the first
// fact triggers), the last of them sees every fact, and every fact is acked
// once it has been decided on.
func TestALoopWithAGapDecidesOnABurstTogether(t *testing.T) {
	_, js, app := start(t)
	const gap, burst = 400 * time.Millisecond, 60
	r := &gapReactor{}
	l := &eventlog.Loop{JS: js, Filters: []string{events.SubjectAll}, Tick: time.Hour, Gap: gap,
		Consumer: &eventlog.Consumer{Name: "test-gap", AckWait: 5 * time.Second}}
	runLoop(t, l, r)
	testkit.Eventually(t, waitLimit, "the loop caught up and decided once", func() bool { return l.CaughtUp() && len(r.decides()) > 0 })
	before := len(r.decides())
	began := time.Now()
	var last uint64
	for i := range burst {
		last = appendQueued(t, app, fmt.Sprintf("gap-%d", i), int64(i+1))
	}
	took := time.Since(began)
	testkit.Eventually(t, waitLimit, "a Decide that saw the whole burst", func() bool {
		d := r.decides()
		return d[len(d)-1] == burst
	})
	n := len(r.decides()) - before
	if limit := 2 + int(took/gap); n > limit {
		t.Errorf("%d Decides for a burst of %d facts over %v, want at most %d (one per %v gap)", n, burst, took.Round(time.Millisecond), limit, gap)
	}
	testkit.Eventually(t, waitLimit, "every fact acked", func() bool {
		info := consumerInfo(t, js, "test-gap")
		return info.AckFloor.Stream >= last && info.NumAckPending == 0
	})
}

// Given a caught-up loop whose reactor is busy, when many calls are posted
// while it is busy (mint answers queueing behind a long Decide), then they
// all run before one Decide, not one Decide each: under load a Decide per
// placement walked the live fleet 10,000 times.
func TestPostedCallsQueuedTogetherAreDecidedOnOnce(t *testing.T) {
	_, js, _ := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	r := &decideRecorder{}
	loop := &eventlog.Loop{JS: js, Filters: []string{events.SubjectAll}, Tick: time.Hour}
	lctx, lcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- loop.Run(lctx, r) }()
	defer func() {
		lcancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	decides := func() int { r.mu.Lock(); defer r.mu.Unlock(); return len(r.seen) }
	testkit.Eventually(t, waitLimit, "the first Decide on an empty log", func() bool { return decides() == 1 })

	const posted = 100
	release := make(chan struct{})
	var ran sync.WaitGroup
	ran.Add(posted + 1)
	loop.Post(ctx, func() { <-release; ran.Done() }) // the loop is busy in here
	for range posted {
		loop.Post(ctx, ran.Done)
	}
	close(release)
	all := make(chan struct{})
	go func() { ran.Wait(); close(all) }()
	select {
	case <-all:
	case <-ctx.Done():
		t.Fatal("the posted calls did not all run")
	}
	testkit.Eventually(t, waitLimit, "a Decide after the posted calls", func() bool { return decides() >= 2 })
	if n := decides() - 1; n != 1 {
		t.Fatalf("%d posted calls queued together were followed by %d Decides, want 1", posted+1, n)
	}
}

// Given a log holding three facts a loop's filter matches, and a consumer
// that lies (it delivers the first fact with a pending count of 0), when
// the loop folds that fact, then it is not caught up and Decide is not
// called until the fold reaches the third fact, the stream's last when the
// loop subscribed (issue 17: one wrong count had the watchdog release and
// tear down a runner the log binds to a running job).
func TestAPendingCountOfZeroIsNotCaughtUp(t *testing.T) {
	_, js, app := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	const host = "host-a"
	var stored []events.Event
	for i := range 3 {
		ref := events.AttemptRef{Attempt: events.AttemptID(int64(i+1), 1), Pool: "linux", Host: host}
		ev := app.New(time.Now(), events.AttemptProvisioning{AttemptRef: ref})
		seq, _, err := app.Append(ctx, ev, nil)
		if err != nil {
			t.Fatal(err)
		}
		ev.Seq = seq
		stored = append(stored, ev)
	}
	rest := make(chan struct{})
	r := &decideRecorder{}
	loop := &eventlog.Loop{JS: js, Filters: []string{events.HostAttemptsFilter(host)}, Tick: time.Millisecond}
	eventlog.SetSource(loop, func(ctx context.Context, _ uint64, ch chan<- eventlog.Delivered) error {
		ch <- eventlog.Delivered{Event: stored[0], Pending: 0} // the lie
		select {
		case <-rest:
		case <-ctx.Done():
			return nil
		}
		for i, ev := range stored[1:] {
			ch <- eventlog.Delivered{Event: ev, Pending: uint64(1 - i)}
		}
		<-ctx.Done()
		return nil
	})
	lctx, lcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- loop.Run(lctx, r) }()
	defer func() {
		lcancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	decides := func() []int { r.mu.Lock(); defer r.mu.Unlock(); return append([]int(nil), r.seen...) }
	testkit.Eventually(t, waitLimit, "the first fact folded", func() bool { return loop.LastSeq() == stored[0].Seq })
	testkit.Consistently(t, 500*time.Millisecond, "no Decide and not caught up before the target", func() bool {
		return len(decides()) == 0 && !loop.CaughtUp()
	})
	close(rest)
	testkit.Eventually(t, waitLimit, "a Decide once the target is reached", func() bool { return len(decides()) > 0 })
	if d := decides(); d[0] != len(stored) {
		t.Fatalf("the first Decide saw %d facts, want all %d the log held at start", d[0], len(stored))
	}
}

// Given a loop reading the whole log and one reading a host's subjects, when
// each is handed facts 1 and 2, then fact 7 (3 to 6 expired before it read
// them, or are other subjects' facts), then the whole-log loop says facts
// 3..6 expired (health shows Truncated) and the filtered one says nothing:
// its gaps are facts of other subjects.
func TestAJumpInSequenceOnTheWholeLogIsFactsThatExpired(t *testing.T) {
	_, js, _ := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	run := func(filter string) *eventlog.Loop {
		loop := &eventlog.Loop{JS: js, Filters: []string{filter}, Tick: time.Millisecond}
		eventlog.SetSource(loop, func(ctx context.Context, _ uint64, ch chan<- eventlog.Delivered) error {
			for _, seq := range []uint64{1, 2, 7} {
				ref := events.AttemptRef{Attempt: events.AttemptID(int64(seq), 1), Pool: "linux", Host: "host-a"}
				ev := events.New("test", time.Now(), events.AttemptProvisioning{AttemptRef: ref})
				ev.Seq = seq
				ch <- eventlog.Delivered{Event: ev}
			}
			<-ctx.Done()
			return nil
		})
		lctx, lcancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- loop.Run(lctx, &decideRecorder{}) }()
		t.Cleanup(func() {
			lcancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
		testkit.Eventually(t, waitLimit, "fact 7 folded", func() bool { return loop.LastSeq() == 7 })
		return loop
	}
	if got := run(events.SubjectAll).Truncated(); !strings.Contains(got, "facts 3..6 expired") {
		t.Errorf("the whole-log loop's Truncated is %q; want it to name facts 3..6 as expired", got)
	}
	if got := run(events.HostAttemptsFilter("host-a")).Truncated(); got != "" {
		t.Errorf("the filtered loop's Truncated is %q; want none: its gaps are other subjects' facts", got)
	}
}
