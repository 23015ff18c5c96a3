package eventlog_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/natsembed"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/nats-io/nats.go/jetstream"
)

// durableReactor records deliveries; it panics on poison ids and its Decide
// can be held to stand for a long reaction.
type durableReactor struct {
	mu      sync.Mutex
	applied map[uint64]int
	order   []uint64 // the facts folded, in the order they came
	skipped map[uint64]error
	poison  map[int64]bool // job ids whose facts make Apply panic
	hold    chan struct{}  // when not nil, Decide waits on it once a fact is folded
}

func newDurableReactor(poison ...int64) *durableReactor {
	r := &durableReactor{applied: map[uint64]int{}, skipped: map[uint64]error{}, poison: map[int64]bool{}}
	for _, job := range poison {
		r.poison[job] = true
	}
	return r
}

// newHeldReactor is a durableReactor whose Decide waits, once a fact is
// folded, until release (which may be called more than once).
func newHeldReactor() (*durableReactor, func()) {
	r := newDurableReactor()
	hold := make(chan struct{})
	r.hold = hold
	var once sync.Once
	return r, func() { once.Do(func() { close(hold) }) }
}

func (r *durableReactor) Apply(d eventlog.Delivered) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d.Err != nil {
		r.skipped[d.Event.Seq] = d.Err
		return
	}
	if q, ok := d.Event.Data.(*events.JobQueued); ok && r.poison[q.JobID] {
		panic(fmt.Sprintf("cannot fold job %d", q.JobID))
	}
	r.applied[d.Event.Seq]++
	r.order = append(r.order, d.Event.Seq)
}

func (r *durableReactor) Decide(ctx context.Context) {
	r.mu.Lock()
	h := r.hold
	folded := len(r.applied) > 0
	r.mu.Unlock()
	if h != nil && folded {
		select {
		case <-h:
		case <-ctx.Done():
		}
	}
}

func (r *durableReactor) has(seq uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.applied[seq] > 0
}

func (r *durableReactor) skip(seq uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.skipped[seq]
}

// runLoop runs l until cleanup and fails the test if it returns an error.
func runLoop(t *testing.T, l *eventlog.Loop, r eventlog.Reactor) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- l.Run(ctx, r) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("loop: %v", err)
		}
	})
}

func appendQueued(t *testing.T, app *eventlog.Appender, delivery string, job int64) uint64 {
	t.Helper()
	seq, _, err := app.Append(ctxFor(t), app.New(t0, queued(delivery, job)), nil)
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

func consumerInfo(t *testing.T, js jetstream.JetStream, name string) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := js.Consumer(ctxFor(t), events.StreamName, name)
	if err != nil {
		t.Fatalf("consumer %s: %v", name, err)
	}
	info, err := c.Info(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func TestDurableLoopAcksOnlyAfterTheReactionReturns(t *testing.T) {
	// Given a loop on a durable consumer whose Decide is held
	_, js, app := start(t)
	r, release := newHeldReactor()
	l := &eventlog.Loop{JS: js, Filters: []string{events.SubjectAll}, Tick: time.Hour,
		Consumer: &eventlog.Consumer{Name: "test-acks", AckWait: 300 * time.Millisecond}}
	runLoop(t, l, r)
	t.Cleanup(release) // runs before the loop's cleanup, which waits for Decide
	testkit.Eventually(t, waitLimit, "consumer created", func() bool {
		_, err := js.Consumer(ctxFor(t), events.StreamName, "test-acks")
		return err == nil
	})

	// When facts arrive and the reaction to them takes longer than AckWait
	seq := appendQueued(t, app, "d-1", 1)
	testkit.Eventually(t, waitLimit, "fact folded", func() bool { return r.has(seq) })

	// Then nothing is acked while the reaction runs, and nothing redelivered,
	// for over 3 AckWaits (without in-progress acks it would be redelivered)
	testkit.Consistently(t, time.Second, "nothing acked or redelivered while the reaction runs", func() bool {
		info := consumerInfo(t, js, "test-acks")
		return info.AckFloor.Stream < seq && info.NumRedelivered == 0
	})
	// And once it returns the ack floor reaches the fact
	release()
	testkit.Eventually(t, waitLimit, "ack floor reaches the fact", func() bool { return consumerInfo(t, js, "test-acks").AckFloor.Stream >= seq })
	if st := l.Stats(); st.Redelivered != 0 {
		t.Fatalf("redelivered %d, want 0", st.Redelivered)
	}
}

func TestPoisonFactIsParkedAndCountedAndTheRestFlows(t *testing.T) {
	// Given a reaction that panics on one fact
	_, js, app := start(t)
	r := newDurableReactor(2)
	l := &eventlog.Loop{JS: js, Filters: []string{events.SubjectAll}, Tick: 100 * time.Millisecond,
		Consumer: &eventlog.Consumer{Name: "test-poison", MaxDeliver: 3}}
	runLoop(t, l, r)

	// When it sits between good facts
	before := appendQueued(t, app, "good-1", 1)
	bad := appendQueued(t, app, "poison", 2)
	after := appendQueued(t, app, "good-2", 3)

	// Then the facts around it are folded at once (it does not stall them)
	testkit.Eventually(t, waitLimit, "facts around the poison folded", func() bool { return r.has(before) && r.has(after) })
	// And after MaxDeliver deliveries it is parked, counted and skipped
	testkit.Eventually(t, waitLimit, "poison parked", func() bool { return l.Stats().Parked == 1 })
	if st := l.Stats(); st.Panics != 3 {
		t.Fatalf("panics %d, want one per delivery (3)", st.Panics)
	}
	if err := r.skip(bad); !errors.Is(err, eventlog.ErrPoison) {
		t.Fatalf("the fold was told %v for the poison fact, want ErrPoison", err)
	}
	var rec eventlog.Parked
	testkit.Eventually(t, waitLimit, "parking record stored", func() bool {
		kv, err := js.KeyValue(ctxFor(t), events.BucketParked)
		if err != nil {
			return false
		}
		e, err := kv.Get(ctxFor(t), fmt.Sprintf("test-poison.%d", bad))
		return err == nil && json.Unmarshal(e.Value(), &rec) == nil
	})
	if rec.Seq != bad || rec.ID == "" || rec.Deliveries != 3 || rec.Error == "" {
		t.Fatalf("parking record %+v", rec)
	}
	// And the loop goes on folding new facts
	later := appendQueued(t, app, "good-3", 4)
	testkit.Eventually(t, waitLimit, "later fact folded", func() bool { return r.has(later) })
	testkit.Eventually(t, waitLimit, "ack floor past the poison", func() bool { return consumerInfo(t, js, "test-poison").AckFloor.Stream >= later })
}

func TestLostConsumerIsRecreatedWithoutLosingFacts(t *testing.T) {
	// Given a loop caught up on a durable consumer
	_, js, app := start(t)
	r := newDurableReactor()
	l := &eventlog.Loop{JS: js, Filters: []string{events.SubjectAll}, Tick: 100 * time.Millisecond,
		Consumer: &eventlog.Consumer{Name: "test-lost", StallAfter: 300 * time.Millisecond}}
	runLoop(t, l, r)
	first := appendQueued(t, app, "d-1", 1)
	testkit.Eventually(t, waitLimit, "first fact folded", func() bool { return r.has(first) })

	// When the server loses the consumer and facts go on arriving
	if err := js.DeleteConsumer(ctxFor(t), events.StreamName, "test-lost"); err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for i := range 5 {
		seqs = append(seqs, appendQueued(t, app, fmt.Sprintf("d-%d", i+2), int64(i+2)))
	}

	// Then the loop recreates it and folds every one of them
	testkit.Eventually(t, waitLimit, "facts after the loss folded", func() bool {
		for _, s := range seqs {
			if !r.has(s) {
				return false
			}
		}
		return true
	})
	if st := l.Stats(); st.Recreated == 0 {
		t.Fatalf("recreated %d times, want at least 1", st.Recreated)
	}
}

// Given a loop caught up on a durable consumer, when one delivery never
// reaches it (another client's pull takes it, as a node that dies with a
// delivery in flight loses it: the server counts it delivered and sends it
// again only after AckWait) and later facts come, then the loop folds every
// fact once and in the log's order: it recreates the consumer from the
// first fact it lacks instead of folding the later ones first. Before, it
// folded them first, and a chaos run's watchdog refused an agent's facts
// about an attempt whose booking had not come yet.
func TestALostDeliveryIsStillFoldedInTheLogsOrder(t *testing.T) {
	_, js, app := start(t)
	r := newDurableReactor()
	const name = "test-order"
	l := &eventlog.Loop{JS: js, Filters: []string{events.SubjectAll}, Tick: 100 * time.Millisecond,
		Consumer: &eventlog.Consumer{Name: name, AckWait: time.Second, StallAfter: time.Hour}}
	runLoop(t, l, r)
	first := appendQueued(t, app, "d-1", 1)
	testkit.Eventually(t, waitLimit, "first fact folded", func() bool { return r.has(first) })

	// Another pull waits on the loop's consumer beside the loop's own.
	cons, err := js.Consumer(ctxFor(t), events.StreamName, name)
	if err != nil {
		t.Fatal(err)
	}
	stolen := make(chan uint64, 1)
	go func() {
		defer close(stolen)
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(waitLimit))
		if err != nil {
			return
		}
		for m := range batch.Messages() {
			if meta, err := m.Metadata(); err == nil {
				stolen <- meta.Sequence.Stream // never acked: the server sends it again after AckWait
			}
		}
	}()
	testkit.Eventually(t, waitLimit, "the other pull waits beside the loop's", func() bool {
		return consumerInfo(t, js, name).NumWaiting >= 2
	})
	seqs := []uint64{first}
	for i := range 6 {
		seqs = append(seqs, appendQueued(t, app, fmt.Sprintf("d-%d", i+2), int64(i+2)))
	}
	took, ok := <-stolen
	if !ok {
		t.Fatal("the other pull took no delivery: the test lost nothing")
	}
	if took == seqs[len(seqs)-1] { // nothing came after it: store one more, so order could break
		seqs = append(seqs, appendQueued(t, app, "d-8", 8))
	}

	awaitFoldedOnceInOrder(t, r, seqs, fmt.Sprintf("seq %d was taken by the other pull", took))
	if l.LastFault().IsZero() {
		t.Fatal("the lost delivery was not recorded as a fault of NATS (Loop.LastFault), which deadlines running across it are charged to")
	}
}

// awaitFoldedOnceInOrder waits until each of seqs is folded, then fails
// unless r folded exactly those, each once and in the log's order.
func awaitFoldedOnceInOrder(t *testing.T, r *durableReactor, seqs []uint64, story string) {
	t.Helper()
	testkit.Eventually(t, waitLimit, "every fact folded", func() bool {
		for _, s := range seqs {
			if !r.has(s) {
				return false
			}
		}
		return true
	})
	r.mu.Lock()
	order := slices.Clone(r.order)
	r.mu.Unlock()
	if !slices.Equal(order, seqs) {
		t.Fatalf("folded %v, want %v: each fact once, in the log's order (%s)", order, seqs, story)
	}
}

// Given a loop whose reaction to a folded fact is still running (so the
// fact is not acked), when the server loses the consumer and the loop
// recreates it from that fact, then the fact the new consumer sends again
// is acked and not folded twice, and the facts after it are folded once.
func TestAFactSentAgainByARecreatedConsumerIsNotFoldedTwice(t *testing.T) {
	// A consumer deleted and made again at once is now and then resumed
	// by the server from the old one's state (its consumer sequence goes
	// on after the first fact), and then there is no copy to see (about
	// 1 run in 40): the scenario is run again, on a new server, until a
	// copy comes, at most five times.
	for try := 1; ; try++ {
		st := recreatedConsumerRun(t)
		if st.Copies > 0 {
			return
		}
		if try == 5 {
			t.Fatalf("in %d runs the recreated consumer sent no copy (last stats %+v): the test did not see what it is about", try, st)
		}
	}
}

// recreatedConsumerRun is one run of the scenario above; it checks that
// every fact is folded once, in order, and returns the loop's stats.
func recreatedConsumerRun(t *testing.T) eventlog.LoopStats {
	_, js, app := start(t)
	r, release := newHeldReactor()
	const name = "test-copies"
	l := &eventlog.Loop{JS: js, Filters: []string{events.SubjectAll}, Tick: time.Hour,
		Consumer: &eventlog.Consumer{Name: name, StallAfter: 300 * time.Millisecond}}
	runLoop(t, l, r)
	t.Cleanup(release) // before the loop's cleanup, which waits for Decide
	// Only a caught-up loop decides (and so holds) before it acks.
	testkit.Eventually(t, waitLimit, "the loop caught up with the empty log", l.CaughtUp)
	first := appendQueued(t, app, "d-1", 1)
	testkit.Eventually(t, waitLimit, "first fact folded, its reaction held", func() bool { return r.has(first) })

	if err := js.DeleteConsumer(ctxFor(t), events.StreamName, name); err != nil {
		t.Fatal(err)
	}
	seqs := []uint64{first}
	for i := range 3 {
		seqs = append(seqs, appendQueued(t, app, fmt.Sprintf("d-%d", i+2), int64(i+2)))
	}
	testkit.Eventually(t, waitLimit, "the consumer recreated", func() bool { return l.Stats().Recreated > 0 })
	release()
	awaitFoldedOnceInOrder(t, r, seqs, "the first was sent again by the recreated consumer")
	return l.Stats()
}

func TestDurableLoopGoesOnAfterTheServerRestarts(t *testing.T) {
	// Given a loop on a durable consumer against a server with a store
	dir := t.TempDir()
	srv := testkit.Server(t, natsembed.EmbeddedConfig{StoreDir: dir})
	addr := srv.Addr().String()
	nc, js := testkit.Connect(t, srv.ClientURL())
	testkit.Stream(t, js, eventlog.StreamConfig{})
	app := &eventlog.Appender{JS: js, Source: "berth/test"}
	r := newDurableReactor()
	l := &eventlog.Loop{JS: js, Filters: []string{events.SubjectAll}, Tick: 100 * time.Millisecond,
		Consumer: &eventlog.Consumer{Name: "test-restart", StallAfter: 500 * time.Millisecond}}
	runLoop(t, l, r)
	first := appendQueued(t, app, "d-1", 1)
	testkit.Eventually(t, waitLimit, "first fact folded", func() bool { return r.has(first) })

	// When the server restarts on the same port and store
	srv.Shutdown()
	srv.WaitForShutdown()
	testkit.Server(t, natsembed.EmbeddedConfig{Listen: addr, StoreDir: dir})
	testkit.Eventually(t, waitLimit, "client reconnected", nc.IsConnected)
	second := appendQueued(t, app, "d-2", 2)

	// Then the loop folds what comes after the restart
	testkit.Eventually(t, waitLimit, "fact after the restart folded", func() bool { return r.has(second) })
}

func TestLoopStartingOnATruncatedLogSaysSo(t *testing.T) {
	// Given a log capped at 3 facts that has dropped its oldest ones
	_, js, app := start(t)
	if _, err := eventlog.EnsureStream(ctxFor(t), js, eventlog.StreamConfig{MaxMsgs: 3}); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		appendQueued(t, app, fmt.Sprintf("d-%d", i), int64(i+1))
	}

	// When a loop with no snapshot starts on it
	r := newDurableReactor()
	l := &eventlog.Loop{JS: js, Filters: []string{events.SubjectAll}, Tick: 100 * time.Millisecond,
		Consumer: &eventlog.Consumer{Name: "test-truncated"}}
	runLoop(t, l, r)

	// Then it folds what is left and says what was lost and what to do
	testkit.Eventually(t, waitLimit, "the facts left folded", func() bool { return r.has(4) && r.has(6) })
	if msg := l.Truncated(); !strings.Contains(msg, "expired") || !strings.Contains(msg, "restart the vmagents") {
		t.Fatalf("Truncated() = %q, want what expired and what to do", msg)
	}
}

func TestStuckReportsFactsTheServerHoldsButDoesNotDeliver(t *testing.T) {
	// Given a loop that may have one fact unacked and whose reaction is held
	_, js, app := start(t)
	r, release := newHeldReactor()
	l := &eventlog.Loop{JS: js, Filters: []string{events.SubjectAll}, Tick: time.Hour,
		Consumer: &eventlog.Consumer{Name: "test-stuck", MaxAckPending: 1, StallAfter: time.Hour}}
	runLoop(t, l, r)
	t.Cleanup(release)
	first := appendQueued(t, app, "d-1", 1)
	testkit.Eventually(t, waitLimit, "first fact folded", func() bool { return r.has(first) })
	if stuck, _ := l.Stuck(ctxFor(t), 200*time.Millisecond); stuck {
		t.Fatal("stuck with nothing pending")
	}

	// When more facts arrive that the server may not deliver
	appendQueued(t, app, "d-2", 2)
	appendQueued(t, app, "d-3", 3)

	// Then Stuck says so, with their number
	testkit.Eventually(t, waitLimit, "stuck reported", func() bool {
		stuck, n := l.Stuck(ctxFor(t), 200*time.Millisecond)
		return stuck && n == 2
	})
	// And once the reaction returns they flow and it is not stuck
	release()
	testkit.Eventually(t, waitLimit, "not stuck", func() bool {
		stuck, _ := l.Stuck(ctxFor(t), 200*time.Millisecond)
		return !stuck && r.has(first+2)
	})
}
