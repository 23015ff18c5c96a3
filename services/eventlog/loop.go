package eventlog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/clock"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// Reactor is a service's decide/evolve pair. Apply and Decide run on the
// loop's one goroutine, so the fold needs no lock; neither may block on I/O
// other than bounded appends (law 3): slow work goes to a goroutine that
// reports back through Loop.Post.
type Reactor interface {
	// Apply folds one delivered fact (or counts an undecodable one).
	Apply(d Delivered)
	// Decide reacts to the fold: it runs once the fold has caught up with
	// the log, after each batch of new facts, and on every tick.
	Decide(ctx context.Context)
}

// Snapshotter is implemented by reactors whose fold can be saved and
// restored, so a restart folds only the tail of the log.
type Snapshotter interface {
	// SaveFold copies the fold, on the loop, and returns a function that
	// encodes the copy to w (called once, off the loop; w compresses what
	// it is given, so the encoding need not be held whole) and the stream
	// sequence it covers.
	SaveFold() (encode func(w io.Writer) error, seq uint64, err error)
	// RestoreFold replaces the fold with a snapshot and returns its sequence.
	RestoreFold(b []byte) (uint64, error)
}

// Loop feeds a Reactor from the log.
type Loop struct {
	JS      jetstream.JetStream
	Filters []string
	// Tick is how often Decide runs without new facts (deadlines); 0 means 1 s.
	Tick time.Duration
	// SnapshotKey, when set and the reactor is a Snapshotter, restores the
	// fold from the snapshot bucket at start and saves it every
	// SnapshotEvery (0: 1 min) while caught up, or less often when
	// encoding one takes over a twentieth of that (snapshotEvery).
	SnapshotKey   string
	SnapshotEvery time.Duration
	// Replicas replicates the snapshot and parking buckets like the log
	// (nats.replicas), so losing one node loses no snapshot; 0 means 1.
	Replicas int
	// Consumer, when set, reads through a durable consumer with explicit
	// acks (services); nil reads with an ordered consumer (tools, tests).
	Consumer *Consumer
	// Clock drives the tick, and so every deadline the reactor decides on
	// (nil: the wall clock). Tests give a clock.Fake and advance it; the
	// gap, acks and snapshots pace real work and stay on wall time.
	Clock clock.Clock
	// Gap, when set, is the least time between two Decides that new facts
	// trigger: facts that arrive sooner are folded at once and decided on
	// together when the gap is over (their acks wait for that Decide). A
	// tick or a posted call decides at once. Decide walks the live fleet,
	// so under a burst a reactor whose decisions are all deadlines of
	// seconds (the watchdog) need not walk it for every fact; the
	// dispatcher and the agents, on the job's path, leave it 0.
	Gap time.Duration

	follower    atomic.Pointer[follower]
	panics      atomic.Uint64
	truncated   atomic.Pointer[string]
	parked      atomic.Uint64
	refused     atomic.Uint64
	overclaims  atomic.Uint64
	stuckLast   stuckAnswer
	parking     atomic.Int32 // parking records being stored
	mismatched  atomic.Uint64
	inbox       chan func()
	once        sync.Once
	caughtUp    atomic.Bool
	target      atomic.Uint64 // the newest matching fact when the loop started (or at the last look before it caught up)
	targetKnown atomic.Bool   // target was read at least once
	lastSeq     atomic.Uint64
	progress    atomic.Int64 // unix nanos of the loop's last turn
	fault       atomic.Int64 // unix nanos (the loop's clock) NATS last failed the service (NoteFault)
	// source, when set (tests), delivers in place of the consumer.
	source func(ctx context.Context, from uint64, ch chan<- Delivered) error
}

func (l *Loop) init() { l.once.Do(func() { l.inbox = make(chan func(), 1024) }) }

// Post runs fn on the loop goroutine (after the current turn). It blocks only
// while the inbox is full, and gives up when ctx ends.
func (l *Loop) Post(ctx context.Context, fn func()) {
	l.init()
	select {
	case l.inbox <- fn:
	case <-ctx.Done():
	}
}

// CaughtUp reports whether the fold has reached the end of the log once,
// and so whether Decide may act (law 11). It means one thing only: the
// fold has applied (or skipped) every fact up to the target, the sequence
// of the newest fact the loop's filters matched in the stream when the loop
// (re)subscribed (read again each tick until reached, if that read failed
// or the facts up to it expired), or the snapshot it restored covers the
// target. Nothing a consumer reports stands in for it: a pending count of
// 0 is the server's estimate, and one wrong count once had the watchdog
// release and tear down a runner the log binds to a running job; silence
// (nothing delivered for a while) is a stalled consumer, not the end.
func (l *Loop) CaughtUp() bool { return l.caughtUp.Load() }

// LogEnd reads where the log ends for this loop: the sequence of the
// newest fact its filters match in the stream (0: none), by a direct get
// per filter. A fold whose LastSeq has reached it holds every fact stored
// before the read.
func (l *Loop) LogEnd(ctx context.Context) (uint64, error) { return l.filteredLast(ctx) }

// NoteFault records that NATS failed this loop's service at at (on its
// clock): a delivery lost or stalled, an append or a read that failed.
// Safe from any goroutine.
func (l *Loop) NoteFault(at time.Time) {
	for {
		old := l.fault.Load()
		if at.UnixNano() <= old || l.fault.CompareAndSwap(old, at.UnixNano()) {
			return
		}
	}
}

// LastFault is the latest time NoteFault recorded (zero: none), what a
// service charges a deadline that ran across it to (law 11).
func (l *Loop) LastFault() time.Time {
	if n := l.fault.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// LastSeq is the last stream sequence applied.
func (l *Loop) LastSeq() uint64 { return l.lastSeq.Load() }

// LastProgress is when the loop last completed a turn; a loop that makes no
// progress for several ticks is stuck and health says so.
func (l *Loop) LastProgress() time.Time { return time.Unix(0, l.progress.Load()) }

// Run follows the log from the start and drives r until ctx ends.
func (l *Loop) Run(ctx context.Context, r Reactor) error {
	l.init()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	snap := l.restore(ctx, r)
	l.checkCovers(ctx, snap.seq)
	ch, errc := l.follow(ctx, snap.seq)
	t := clock.Or(l.Clock).NewTicker(l.tick())
	defer t.Stop()
	l.progress.Store(time.Now().UnixNano())
	l.startCatchUp(ctx, r, snap, l.tick())
	tn := &turn{}
	defer tn.stopGap()
	for {
		decide, byFacts := false, false
		select {
		case <-ctx.Done():
			<-errc
			l.final(snap)
			return nil
		case err := <-errc:
			if ctx.Err() != nil {
				return nil // stopping: the follower saw the cancel first
			}
			return err
		case fn := <-l.inbox:
			l.runPosted(fn)
			decide = true
		case <-tn.gapC:
			tn.gapC = nil
			decide = true
		case <-t.C():
			decide = true
			if !l.caughtUp.Load() && l.targetKnown.Load() && l.target.Load() <= max(snap.seq, l.lastSeq.Load()) {
				l.caughtUp.Store(true)
			}
			l.save(ctx, snap)
		case d := <-ch:
			tn.batch = l.applyBuffered(ctx, r, d, ch, tn.batch)
			decide, byFacts = true, true
		}
		l.endTurn(ctx, r, tn, decide, byFacts)
	}
}

func (l *Loop) tick() time.Duration {
	if l.Tick == 0 {
		return time.Second
	}
	return l.Tick
}

// checkCovers records, for health, a start on a log whose oldest facts
// expired before the snapshot covered them.
func (l *Loop) checkCovers(ctx context.Context, seq uint64) {
	if err := CheckCovers(ctx, l.JS, seq); errors.Is(err, ErrTruncated) {
		// Not fatal: what expired is older than any job the fold still
		// keeps (config validation ties max_age to the retention), but a
		// host that announced itself before then is unknown until it
		// announces again. Health shows it so an operator restarts agents.
		msg := err.Error() + "; restart the vmagents so hosts announce themselves again, and keep snapshots (berth_snapshots) to avoid this"
		l.truncated.Store(&msg)
		slog.Error("starting from a truncated log", "reader", l.reader(), "err", msg)
	}
}

// followBuffer is how many decoded facts wait for the loop between its
// turns: the follower decodes up to this many ahead while the loop folds
// and decides, and the durable consumer keeps up to 512 more pulled, not
// yet decoded (durable.go). A deeper buffer costs even when empty: a
// Delivered is 160 B that the garbage collector scans on every cycle. At
// 1,024 slots that was 160 KiB a loop, and for the bench's 500 agents in
// one process most of the 65 MiB their idle heap lost at 128 (the scale
// phase's heap profile). Throughput did not move: two runs each, in
// turn, gave 331 and 344 lifecycles/s at 1,024 slots, 312 and 355 at 128.
const followBuffer = 128

// follow starts delivering facts after seq: through the durable consumer
// when the loop has one, through an ordered consumer otherwise.
func (l *Loop) follow(ctx context.Context, seq uint64) (<-chan Delivered, <-chan error) {
	ch := make(chan Delivered, followBuffer)
	errc := make(chan error, 1)
	if l.source != nil {
		go func() { errc <- l.source(ctx, seq+1, ch) }()
		return ch, errc
	}
	if l.Consumer != nil {
		f := newFollower(l.JS, *l.Consumer, l.Filters)
		f.onFault = func() { l.NoteFault(clock.Or(l.Clock).Now()) }
		l.follower.Store(f)
		go func() { errc <- f.run(ctx, seq+1, ch) }()
	} else {
		// A loop without a named consumer (tests, tools) reads under a
		// random name: only the services' own names are granted by NATS
		// permissions (natsauth), so this works without authorization only.
		name := "berth-follow-" + nuid.Next()
		go func() { errc <- Follow(ctx, l.JS, name, l.Filters, seq+1, ch) }()
	}
	return ch, errc
}

// startCatchUp reads where the log stood at start. Caught up means the fold
// holds every fact the filters match that was in the log at start: only
// then may Decide act (an agent deciding on a fold that has an attempt's
// placement but not yet its later facts would create a VM that was created
// and stopped long ago). A log the snapshot already covers is caught up at
// once; otherwise only a delivery reaching the target tells (CaughtUp
// says what caught up means; a pending count of 0 does not). Silence is
// never taken for "caught up": a consumer stalled by a NATS outage
// delivers nothing for a while.
func (l *Loop) startCatchUp(ctx context.Context, r Reactor, snap *snapState, every time.Duration) {
	if target, err := l.filteredLast(ctx); err == nil {
		l.target.Store(target)
		l.targetKnown.Store(true)
		if target <= snap.seq {
			l.caughtUp.Store(true)
			r.Decide(ctx) // nothing will arrive to trigger it before the first tick
		}
	}
	if !l.caughtUp.Load() {
		go l.refreshTarget(ctx, every)
	}
}

// runPosted runs fn and what else is posted before deciding: under load
// the mint calls' answers queue here, and a Decide after each one would
// walk the live fleet once per placement.
func (l *Loop) runPosted(fn func()) {
	fn()
	for n := len(l.inbox); n > 0; n-- {
		(<-l.inbox)()
	}
}

// applyBuffered folds d and what is already buffered behind it, so Decide
// sees a batch.
func (l *Loop) applyBuffered(ctx context.Context, r Reactor, d Delivered, ch <-chan Delivered, batch []Delivered) []Delivered {
	batch = l.apply(ctx, r, d, batch)
	for {
		select {
		case d := <-ch:
			batch = l.apply(ctx, r, d, batch)
		default:
			return batch
		}
	}
}

// turn is one loop's state between turns: the facts folded and not yet
// acked, and the gap timer that paces Decides that facts trigger.
type turn struct {
	batch      []Delivered
	lastDecide time.Time
	gap        *time.Timer // armed while facts wait for the gap to end
	gapC       <-chan time.Time
}

func (tn *turn) stopGap() {
	if tn.gap != nil {
		tn.gap.Stop()
	}
}

// holdForGap arms the gap timer when facts arrive sooner than Gap after
// the last Decide; it reports whether the Decide (and the acks) wait.
func (l *Loop) holdForGap(tn *turn, byFacts bool) bool {
	if !byFacts || l.Gap <= 0 || !l.caughtUp.Load() {
		return false
	}
	wait := l.Gap - time.Since(tn.lastDecide)
	if wait <= 0 {
		return false
	}
	if tn.gapC == nil {
		if tn.gap == nil {
			tn.gap = time.NewTimer(wait)
		} else {
			tn.gap.Reset(wait)
		}
		tn.gapC = tn.gap.C
	}
	return true
}

// endTurn decides (once caught up) and then acks the batch: only now is it
// folded and, once caught up, has Decide stored the reaction's own facts
// (its appends are synchronous).
func (l *Loop) endTurn(ctx context.Context, r Reactor, tn *turn, decide, byFacts bool) {
	defer l.progress.Store(time.Now().UnixNano())
	if l.holdForGap(tn, byFacts) {
		return // decided on, and acked, when the gap ends
	}
	if decide && l.caughtUp.Load() {
		l.decide(ctx, r, tn.batch)
		tn.lastDecide = time.Now()
		if tn.gapC != nil {
			tn.gap.Stop() // this Decide saw what the gap held back
			tn.gapC = nil
		}
	}
	for _, d := range tn.batch {
		d.ack()
	}
	tn.batch = tn.batch[:0]
}

// apply folds one delivery and adds it to the batch to ack. A reaction that
// panics is retried through a redelivery; at the consumer's MaxDeliver it is
// parked and skipped, so one poison fact never stalls the rest.
func (l *Loop) apply(ctx context.Context, r Reactor, d Delivered, batch []Delivered) []Delivered {
	if err := applySafely(r, d); err != nil {
		l.panics.Add(1)
		if d.msg != nil && d.Deliveries < d.MaxDeliver {
			slog.Error("reacting to an event failed; it will be delivered again", "seq", d.Event.Seq,
				"subject", d.Event.Subject, "delivery", d.Deliveries, "of", d.MaxDeliver, "err", err)
			d.retry(time.Duration(d.Deliveries) * 250 * time.Millisecond)
			return batch
		}
		l.park(d, err)
		skip := Delivered{Event: events.Event{Seq: d.Event.Seq, Subject: d.Event.Subject, ID: d.Event.ID},
			Err: fmt.Errorf("%w: %v", ErrPoison, err)}
		_ = applySafely(r, skip) // moves the fold past it (a pool ledger's sequence too)
		d.drop("berth: parked as poison")
		l.parked.Add(1)
	} else {
		batch = append(batch, d)
	}
	l.noteExpired(d.Event.Seq)
	l.lastSeq.Store(max(l.lastSeq.Load(), d.Event.Seq))
	// Reaching the target, never the pending count (CaughtUp).
	if l.targetKnown.Load() && d.Event.Seq >= l.target.Load() {
		l.caughtUp.Store(true)
	}
	return batch
}

// refreshTarget asks for the target again every tick until the loop is
// caught up, off the loop (a slow server must not hold the fold): the
// start's read may have failed, and facts up to the target may have
// expired since.
func (l *Loop) refreshTarget(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for !l.caughtUp.Load() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if target, err := l.filteredLast(ctx); err == nil {
			l.target.Store(target)
			l.targetKnown.Store(true)
		}
	}
}

// filteredLast returns the sequence of the newest fact the loop's filters
// match (0: none), the point the fold must reach before Decide may act.
func (l *Loop) filteredLast(ctx context.Context) (uint64, error) {
	if len(l.Filters) == 0 {
		return LastSeq(ctx, l.JS)
	}
	var last uint64
	for _, f := range l.Filters {
		// A direct get, not the stream's info: an agent may not read it
		// (it would list every subject, natsauth).
		m, err := LastOn(ctx, l.JS, f)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
		case err != nil:
			return 0, err
		default:
			last = max(last, m.Seq)
		}
	}
	return last, nil
}

// decide runs Decide; while it runs longer than a third of AckWait, the
// batch it reacts to is kept from redelivery with in-progress acks.
func (l *Loop) decide(ctx context.Context, r Reactor, batch []Delivered) {
	if l.Consumer == nil || len(batch) == 0 {
		r.Decide(ctx)
		return
	}
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(l.follower.Load().cfg.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				for _, d := range batch {
					d.working()
				}
			}
		}
	}()
	defer close(done)
	r.Decide(ctx)
}

func applySafely(r Reactor, d Delivered) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	r.Apply(d)
	return nil
}

// noteExpired records, for health, the facts that expired between the last
// one this loop folded and seq, when the loop reads the whole log: it is
// handed every stored fact and the stream denies deletes, so a jump in
// sequence is facts that expired under the retention limits before it read
// them (its consumer was made after they went, or it fell that far
// behind). checkCovers finds the same at the start; this finds it after:
// a test service made its consumer only after 37 facts were written to a
// stream of 25 and folded from the 13th on, and nothing said so. Not
// fatal, as at the start, but never silent. A filtered loop's gaps are
// other subjects' facts, and say nothing.
func (l *Loop) noteExpired(seq uint64) {
	last := l.lastSeq.Load()
	if seq <= last+1 || !l.readsWholeLog() {
		return
	}
	which := fmt.Sprintf("facts %d..%d", last+1, seq-1)
	if seq-1 == last+1 {
		which = fmt.Sprintf("fact %d", seq-1)
	}
	msg := which + " expired under the stream's retention limits before this service folded them; " +
		"restart the vmagents so hosts announce themselves again, and raise nats.max_age, max_bytes or max_msgs so facts outlive a slow or late reader"
	l.truncated.Store(&msg)
	slog.Error("facts expired before they were folded", "reader", l.reader(), "from_seq", last+1, "to_seq", seq-1)
}

// readsWholeLog: the loop's filters match every fact.
func (l *Loop) readsWholeLog() bool {
	return len(l.Filters) == 0 || (len(l.Filters) == 1 && l.Filters[0] == events.SubjectAll)
}

// Truncated says, when not empty, that the loop started on a log whose
// oldest facts had expired before its snapshot covered them, or that facts
// expired before it read them (noteExpired), and what to do.
func (l *Loop) Truncated() string {
	if p := l.truncated.Load(); p != nil {
		return *p
	}
	return ""
}

// Stuck reports, for a loop on a durable consumer, whether the server has
// held facts for it that it has not received for longer than d, and how
// many. A loop that caught up once and then stopped receiving still turns
// on ticks; this is what tells.
func (l *Loop) Stuck(ctx context.Context, d time.Duration) (bool, uint64) {
	if f := l.follower.Load(); f != nil {
		return f.stuck(ctx, d)
	}
	return false, 0
}

// StuckLast is Stuck without waiting, for a health check: the last answer
// (not stuck until one came), while a fresh one is asked in the background
// (bounded by 5 s) unless a question is out. Stuck asks the server for the
// consumer's info once nothing came for d (an idle system's normal state),
// and during a stream leader election that takes seconds: a /healthz that
// waited on it timed out on a service that was fine.
func (l *Loop) StuckLast(d time.Duration) (bool, uint64) {
	a := &l.stuckLast
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.asking {
		a.asking = true
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			stuck, pending := l.Stuck(ctx, d)
			cancel()
			a.mu.Lock()
			a.stuck, a.pending, a.asking = stuck, pending, false
			a.mu.Unlock()
		}()
	}
	return a.stuck, a.pending
}

// stuckAnswer is StuckLast's last answer and whether a question is out.
type stuckAnswer struct {
	mu      sync.Mutex
	asking  bool
	stuck   bool
	pending uint64
}

// Lag is how many facts the server holds for this loop's durable consumer
// that it has not delivered yet; ok is false without a durable consumer or
// when the server cannot be asked.
func (l *Loop) Lag(ctx context.Context) (n uint64, ok bool) {
	if f := l.follower.Load(); f != nil {
		return f.pending(ctx)
	}
	return 0, false
}

// LoopStats are a loop's counters since it started.
type LoopStats struct {
	FollowerStats
	Panics uint64 // deliveries whose Apply panicked
	Parked uint64 // facts parked as poison after MaxDeliver deliveries
	// Refused counts facts the shell refused: their subject does not
	// confirm their payload or their author (events.ErrForged).
	Refused uint64
	// Overclaims counts host announcements that claimed more than the
	// host's grant (events.Offer): folded within the grant, and parked.
	Overclaims uint64
	// Mismatched counts duplicate answers whose stored fact, read back,
	// was not the shell's own (DupTaken): each was appended under a fresh
	// id (Shell, issue 17).
	Mismatched uint64
}

// Stats reads the loop's counters; safe from any goroutine once Run started.
func (l *Loop) Stats() LoopStats {
	s := LoopStats{Panics: l.panics.Load(), Parked: l.parked.Load(), Refused: l.refused.Load(), Overclaims: l.overclaims.Load(), Mismatched: l.mismatched.Load()}
	if f := l.follower.Load(); f != nil {
		s.FollowerStats = f.Stats()
	}
	return s
}

// snapState is the loop's snapshot bookkeeping.
type snapState struct {
	kv    jetstream.KeyValue
	s     Snapshotter
	seq   uint64 // sequence of the snapshot restored
	saved time.Time
	cost  atomic.Int64 // nanoseconds the last snapshot took to copy and encode
	// stored is the sequence of the last snapshot stored; storing runs off
	// the loop, one at a time (putting is set while one runs).
	stored  atomic.Uint64
	putting atomic.Bool
	puts    sync.WaitGroup
}

// restore loads the service's snapshot, if any. Any failure means a full
// replay, never a failed start.
func (l *Loop) restore(ctx context.Context, r Reactor) *snapState {
	st := &snapState{saved: time.Now()}
	s, ok := r.(Snapshotter)
	if !ok || l.SnapshotKey == "" {
		return st
	}
	kctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	kv, err := OpenBucket(kctx, l.JS, events.BucketSnapshots, l.Replicas)
	if err != nil {
		slog.Warn("snapshot bucket unavailable; replaying the whole log", "err", err)
		return st
	}
	st.kv, st.s = kv, s
	b, err := GetSnapshot(kctx, kv, l.SnapshotKey)
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			slog.Warn("snapshot unreadable; replaying the whole log", "key", l.SnapshotKey, "err", err)
		}
		return st
	}
	seq, err := s.RestoreFold(b)
	if err != nil {
		slog.Warn("snapshot unusable; replaying the whole log", "key", l.SnapshotKey, "err", err)
		return st
	}
	st.seq = seq
	st.stored.Store(seq)
	l.lastSeq.Store(seq)
	slog.Info("restored from snapshot", "key", l.SnapshotKey, "seq", seq)
	return st
}

// final saves a last snapshot on the way out, so the next start folds only
// what came after it.
func (l *Loop) final(st *snapState) {
	st.puts.Wait() // a periodic put still running
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	st.saved = time.Time{}
	l.save(ctx, st)
	st.puts.Wait()
}

// snapshotShare bounds the loop's time spent encoding snapshots: the next
// snapshot waits at least snapshotShare times as long as the last one
// took. A fold holding the records of a busy fleet's settle window
// (tens of thousands of jobs) takes seconds to encode, and every minute
// would stop the loop that long, again and again, as history grows within
// the window; a restart then folds a longer tail, which is cheap beside it.
const snapshotShare = 20

// snapshotEvery is how long after the last snapshot the next is due: base
// (0: a minute), or snapshotShare times the last one's encoding when that
// is longer, but never over ten times base: a snapshot must come well
// within the log's retention, or a restart meets facts that expired.
func snapshotEvery(base, cost time.Duration) time.Duration {
	if base <= 0 {
		base = time.Minute
	}
	return min(max(base, snapshotShare*cost), 10*base)
}

// save writes a snapshot every SnapshotEvery while caught up and moving,
// spacing them further when making one takes long (snapshotEvery).
// The fold is copied on the loop, where it is consistent (SaveFold);
// encoding, compressing and storing the copy run off the loop, so facts
// keep being folded and decided on meanwhile. A put still running when the
// next one is due delays it.
func (l *Loop) save(ctx context.Context, st *snapState) {
	every := snapshotEvery(l.SnapshotEvery, time.Duration(st.cost.Load()))
	if st.kv == nil || !l.caughtUp.Load() || time.Since(st.saved) < every || l.lastSeq.Load() <= st.stored.Load() || st.putting.Load() {
		return
	}
	st.saved = time.Now()
	encode, seq, err := st.s.SaveFold()
	held := time.Since(st.saved)
	if err != nil {
		slog.Warn("snapshot failed", "key", l.SnapshotKey, "err", err)
		return
	}
	st.putting.Store(true)
	st.puts.Add(1)
	go func() {
		defer st.puts.Done()
		defer st.putting.Store(false)
		start := time.Now()
		z, err := gzipSnapshot(encode)
		st.cost.Store(int64(held + time.Since(start)))
		if err != nil {
			slog.Warn("snapshot failed", "key", l.SnapshotKey, "err", err)
			return
		}
		kctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := putZipped(kctx, l.JS, st.kv, l.SnapshotKey, seq, z); err != nil {
			slog.Warn("snapshot not stored; a restart will fold more of the log", "key", l.SnapshotKey, "err", err)
			return
		}
		st.stored.Store(seq)
	}()
}
