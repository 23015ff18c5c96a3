package eventlog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/nats-io/nats.go/jetstream"
)

// Consumer is a service's durable pull consumer on BERTH_EVENTS. The fold's
// restart position is its snapshot, not the consumer: at every start the
// loop recreates the consumer at the snapshot's sequence + 1, so a restart
// never misses what the snapshot does not cover. Within a run the consumer
// gives what an ordered consumer cannot: explicit acks (its ack floor, seen
// with `nats consumer info BERTH_EVENTS <name>`, is how far the service has
// folded and reacted), redelivery of what was not acked within AckWait, a
// bounded number of deliveries per message, and survival across reconnects
// and server restarts.
type Consumer struct {
	// Name is the durable name, unique per running instance
	// (berth-dispatcher-<instance>): two processes sharing one would split
	// the log between them and each fold half of it.
	Name string
	// AckWait is how long the server waits for an ack before redelivering;
	// 0 means 30 s. A reaction that runs longer sends in-progress acks.
	AckWait time.Duration
	// MaxDeliver is how often one message is delivered before it is parked
	// as poison; 0 means 5.
	MaxDeliver int
	// MaxAckPending bounds the messages delivered and not yet acked; 0 means
	// 4096. When a loop falls that far behind the server stops delivering
	// (back-pressure) instead of growing a buffer.
	MaxAckPending int
	// StallAfter is how long a pull may wait with nothing delivered while
	// the server says messages are pending before the consumer is
	// considered stalled and recreated; 0 means 10 s.
	StallAfter time.Duration
	// InactiveThreshold removes the consumer after this long without a
	// client (an instance that is gone for good); 0 means 1 h.
	InactiveThreshold time.Duration

	// ackNone makes a follower that acknowledges nothing (Follow): the
	// server forgets a message once delivered, so a lost delivery is seen
	// as a gap in the consumer's sequence and the consumer is recreated
	// after the last fact received, as an ordered consumer would be.
	ackNone bool
}

func (c Consumer) withDefaults() Consumer {
	if c.AckWait <= 0 {
		c.AckWait = 30 * time.Second
	}
	if c.MaxDeliver <= 0 {
		c.MaxDeliver = 5
	}
	if c.MaxAckPending <= 0 {
		c.MaxAckPending = 4096
	}
	if c.StallAfter <= 0 {
		c.StallAfter = 10 * time.Second
	}
	if c.InactiveThreshold <= 0 {
		c.InactiveThreshold = time.Hour
	}
	return c
}

// FollowerStats are a follower's counters since it started.
type FollowerStats struct {
	Redelivered uint64 // messages delivered more than once (not acked in time, or nak'd)
	Recreated   uint64 // times the consumer was found stalled or gone and recreated
	Copies      uint64 // deliveries of facts the loop had already (acked, not handed again)
}

// unacked tracks what was handed to the loop and not yet acked, so a
// recreated consumer starts at the oldest of those, and keeps the loop's
// view in the log's order: a copy of a fact already handed (the server
// redelivering one whose ack it lost, or a recreated consumer starting
// before the last fact handed) is not handed again, unless the loop asked
// for it again (a reaction that failed, retried).
type unacked struct {
	mu      sync.Mutex
	out     map[uint64]int      // stream seq → deliveries handed and not yet settled
	again   map[uint64]struct{} // stream seqs the loop asked to see again
	highest uint64              // the highest stream seq handed to the loop
}

func (u *unacked) delivered(seq uint64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.out[seq]++
	u.highest = max(u.highest, seq)
	delete(u.again, seq)
}

func (u *unacked) settled(seq uint64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.settle(seq)
}

func (u *unacked) settle(seq uint64) {
	if u.out[seq] <= 1 {
		delete(u.out, seq)
	} else {
		u.out[seq]--
	}
}

// retrying settles a delivery the loop asked to see again.
func (u *unacked) retrying(seq uint64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.settle(seq)
	if u.again == nil {
		u.again = map[uint64]struct{}{}
	}
	u.again[seq] = struct{}{}
}

// handed reports whether seq is a copy of a fact the loop already has: at
// or below the highest handed, and not one it asked to see again. The
// consumer hands first deliveries in the log's order and the follower
// hands nothing past a lost one (consume), so no fact the loop lacks is
// below the highest.
func (u *unacked) handed(seq uint64) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	_, again := u.again[seq]
	return seq <= u.highest && !again
}

// resumeFrom is the sequence a recreated consumer starts at: the oldest
// fact handed and not settled, or asked for again, or the one after the
// highest handed.
func (u *unacked) resumeFrom(start uint64) uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.highest == 0 {
		return start
	}
	from := u.highest + 1
	for seq := range u.out {
		from = min(from, seq)
	}
	for seq := range u.again {
		from = min(from, seq)
	}
	return from
}

// follower reads the log through a durable consumer.
type follower struct {
	js      jetstream.JetStream
	started bool // a consumer was created: later creates replace this process's own
	cfg     Consumer
	subj    []string
	track   unacked
	stats   struct{ redelivered, recreated, copies atomic.Uint64 }
	cons    atomic.Value // the live jetstream.Consumer, for Stuck
	last    atomic.Int64 // unix nanos of the last delivery
	onFault func()       // told of each failed pull and each recreation (Loop.NoteFault)
}

func (f *follower) fault() {
	if f.onFault != nil {
		f.onFault()
	}
}

// pending asks the server how many facts it holds for the follower that
// are not yet delivered (its lag); ok is false when it cannot tell.
func (f *follower) pending(ctx context.Context) (uint64, bool) {
	c, ok := f.cons.Load().(jetstream.Consumer)
	if !ok {
		return 0, false
	}
	ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	info, err := c.Info(ictx)
	if err != nil {
		return 0, false
	}
	return info.NumPending, true
}

// stuck reports a follower that the server holds facts for and that has
// delivered none for longer than d: what health must show even while the
// loop still turns on ticks (law 6). Errors reading the consumer are not
// taken as stuck: a reconnect is the transport's business.
func (f *follower) stuck(ctx context.Context, d time.Duration) (bool, uint64) {
	c, ok := f.cons.Load().(jetstream.Consumer)
	if !ok || time.Since(time.Unix(0, f.last.Load())) < d {
		return false, 0
	}
	ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	info, err := c.Info(ictx)
	if err != nil {
		return false, 0
	}
	return info.NumPending > 0, info.NumPending
}

func newFollower(js jetstream.JetStream, c Consumer, filters []string) *follower {
	return &follower{js: js, cfg: c.withDefaults(), subj: filters, track: unacked{out: map[uint64]int{}}}
}

func (f *follower) Stats() FollowerStats {
	return FollowerStats{Redelivered: f.stats.redelivered.Load(), Recreated: f.stats.recreated.Load(), Copies: f.stats.copies.Load()}
}

// errStalled ends one consumer's life so that run recreates it.
var errStalled = errors.New("consumer stalled or gone")

// run delivers from startSeq until ctx ends, recreating the consumer
// whenever it is deleted, lost with a server, or stalls.
func (f *follower) run(ctx context.Context, startSeq uint64, out chan<- Delivered) error {
	from := max(startSeq, 1)
	for {
		cons, err := f.create(ctx, from)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if f.cfg.ackNone && !f.started {
				// Follow's caller decides whether to retry, as it did with
				// an ordered consumer that could not be made.
				return fmt.Errorf("follow %v as %s: %w", f.subj, f.cfg.Name, err)
			}
			slog.Warn("durable consumer: cannot create it yet; retrying", "consumer", f.cfg.Name, "err", err, "hint", createHint(err))
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
			continue
		}
		f.cons.Store(cons)
		f.last.Store(time.Now().UnixNano())
		err = f.consume(ctx, cons, out)
		if ctx.Err() != nil {
			f.release()
			return ctx.Err()
		}
		from = f.track.resumeFrom(from)
		f.stats.recreated.Add(1)
		f.fault()
		slog.Warn("durable consumer stalled or lost; recreating it", "consumer", f.cfg.Name, "from_seq", from, "err", err)
	}
}

// create replaces the consumer with one that starts at from. Its
// configuration cannot be changed in place (a start sequence is fixed at
// creation), so an old one is deleted first.
func (f *follower) create(ctx context.Context, from uint64) (jetstream.Consumer, error) {
	if !f.started {
		if err := f.checkFree(ctx); err != nil {
			return nil, err
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := f.js.DeleteConsumer(cctx, events.StreamName, f.cfg.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("delete consumer %s: %w", f.cfg.Name, err)
	}
	cc := jetstream.ConsumerConfig{
		Durable:           f.cfg.Name,
		Description:       "Berth service fold; ack floor = folded and reacted",
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		AckPolicy:         jetstream.AckExplicitPolicy,
		AckWait:           f.cfg.AckWait,
		MaxDeliver:        f.cfg.MaxDeliver,
		MaxAckPending:     f.cfg.MaxAckPending,
		InactiveThreshold: f.cfg.InactiveThreshold,
	}
	if len(f.subj) == 1 {
		cc.FilterSubject = f.subj[0]
	} else {
		cc.FilterSubjects = f.subj
	}
	if f.cfg.ackNone {
		cc.Description = "Berth follower (no acks; recreated after the last fact received)"
		cc.AckPolicy, cc.AckWait, cc.MaxDeliver, cc.MaxAckPending = jetstream.AckNonePolicy, 0, 0, 0
	}
	if from > 1 {
		cc.DeliverPolicy, cc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	cons, err := f.js.CreateConsumer(cctx, events.StreamName, cc)
	if err == nil {
		f.started = true
	}
	return cons, err
}

// ErrConsumerInUse: another process reads through the consumer this one
// would create. Two replicas of a service run with the same instance name
// (config instance, BERTH_INSTANCE); sharing the consumer would split the
// log between them, each folding half of it.
var ErrConsumerInUse = errors.New("another process is reading through this consumer")

// inUseLooks and inUseEvery: how long a process's first create watches an
// existing consumer of its name for pull requests before replacing it. A
// live reader always has one waiting (pulls expire after 5 s and are
// renewed before); a killed one's expire within 5 s. One look without any
// means nobody reads.
var (
	inUseLooks = 13
	inUseEvery = 500 * time.Millisecond
)

// checkFree fails with ErrConsumerInUse when a consumer of the follower's
// name has pull requests waiting on every look over 6 s: a live process
// reads it. A consumer that is absent, idle, or whose reader died is free
// (a restart of the same instance replaces its own consumer).
func (f *follower) checkFree(ctx context.Context) error {
	for i := 0; i < inUseLooks; i++ {
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		c, err := f.js.Consumer(ictx, events.StreamName, f.cfg.Name)
		var waiting int
		if err == nil {
			if info, ierr := c.Info(ictx); ierr == nil {
				waiting = info.NumWaiting
			}
		}
		cancel()
		if errors.Is(err, jetstream.ErrConsumerNotFound) || (err == nil && waiting == 0) {
			return nil
		}
		if err != nil {
			return nil // cannot tell: the create that follows reports a real fault
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(inUseEvery):
		}
	}
	return fmt.Errorf("consumer %s: %w", f.cfg.Name, ErrConsumerInUse)
}

// createHint says what to do about a failed create. NATS answers a
// permissions violation asynchronously (the request itself only times
// out), so a refused name cannot be told from an unreachable server here.
func createHint(err error) string {
	if errors.Is(err, ErrConsumerInUse) {
		return "two replicas share an instance name: give each its own (config instance or BERTH_INSTANCE)"
	}
	return "is NATS up and the stream there (berth stream apply)? Under berth nats-auth, a dispatcher or watchdog replica's instance name (config instance or BERTH_INSTANCE) must be one given to --instances"
}

// release deletes the consumer on a clean stop; a killed process leaves it
// to InactiveThreshold.
func (f *follower) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = f.js.DeleteConsumer(ctx, events.StreamName, f.cfg.Name)
}

// consume pulls until ctx ends or the consumer stalls or disappears.
func (f *follower) consume(ctx context.Context, cons jetstream.Consumer, out chan<- Delivered) error {
	it, err := cons.Messages(jetstream.PullMaxMessages(512), jetstream.PullExpiry(5*time.Second))
	if err != nil {
		return fmt.Errorf("%w: %v", errStalled, err)
	}
	defer it.Stop()
	defer context.AfterFunc(ctx, it.Stop)() // Next does not watch ctx itself
	var waitingSince atomic.Int64           // unix nanos a Next began waiting; 0 while not waiting
	var lastCons uint64                     // the consumer sequence last delivered (inOrder)
	var stalled atomic.Pointer[error]
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go f.watch(wctx, cons, &waitingSince, &stalled, it.Stop)
	for {
		waitingSince.Store(time.Now().UnixNano())
		msg, err := it.Next()
		waitingSince.Store(0)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if p := stalled.Load(); p != nil {
				return *p
			}
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || errors.Is(err, jetstream.ErrConsumerDeleted) ||
				errors.Is(err, jetstream.ErrConsumerNotFound) {
				return fmt.Errorf("%w: %v", errStalled, err)
			}
			f.fault()
			slog.Warn("durable consumer: retrying", "consumer", f.cfg.Name, "err", err)
			continue
		}
		meta, err := msg.Metadata()
		if err != nil {
			_ = msg.Term()
			continue
		}
		seq := meta.Sequence.Stream
		f.last.Store(time.Now().UnixNano())
		if meta.NumDelivered > 1 {
			f.stats.redelivered.Add(1)
		}
		if err := f.inOrder(&lastCons, meta.Sequence.Consumer); err != nil {
			return err
		}
		if !f.cfg.ackNone && f.track.handed(seq) {
			_ = msg.Ack() // a copy: the loop folded this fact already
			f.stats.copies.Add(1)
			continue
		}
		f.track.delivered(seq)
		ev, derr := events.Unmarshal(msg.Data(), seq)
		ev.Seq, ev.Subject = seq, msg.Subject()
		ev.ClampToStored(meta.Timestamp) // the log's clock, not the writer's
		d := Delivered{Event: ev, Pending: meta.NumPending, Err: derr, Deliveries: meta.NumDelivered,
			MaxDeliver: uint64(f.cfg.MaxDeliver), msg: msg, track: &f.track}
		if f.cfg.ackNone {
			f.track.settled(seq) // nothing to ack: a recreate resumes after it
			d.msg, d.Deliveries, d.MaxDeliver = nil, 0, 0
		}
		select {
		case out <- d:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// inOrder checks a delivery's consumer sequence against the last one's. A
// gap is a delivery lost on its way (a node died with it in flight): the
// server, which counts it delivered, sends it again only after AckWait
// (with acks) or never (without), after facts stored later. Folding those
// first would fold out of the log's order, and a fact about an attempt
// whose booking has not come yet is refused as forged (law 10; a chaos
// run's watchdog refused an agent's facts, and judged deadlines on a view
// with holes). So the consumer is recreated from the first fact not yet
// handed over. A sequence that goes back (a new consumer leader resuming
// from its replicated state) is taken as it comes: what it sends again is
// a copy (unacked.handed).
func (f *follower) inOrder(last *uint64, cons uint64) error {
	switch {
	case f.cfg.ackNone && cons != *last+1: // nothing is ever sent again: any break is a loss
		return fmt.Errorf("%w: delivery %d came after %d (one was lost)", errStalled, cons, *last)
	case *last != 0 && cons > *last+1:
		return fmt.Errorf("%w: delivery %d came after %d (one was lost on its way)", errStalled, cons, *last)
	}
	*last = cons
	return nil
}

// watch declares the consumer stalled when a pull has waited StallAfter
// with nothing delivered while the server holds messages for it on two
// looks in a row (one look can race a message just stored), or when the
// server no longer knows it (deleted, or lost with a node's state).
func (f *follower) watch(ctx context.Context, cons jetstream.Consumer, waitingSince *atomic.Int64, stalled *atomic.Pointer[error], stop func()) {
	t := time.NewTicker(max(f.cfg.StallAfter/4, 50*time.Millisecond))
	defer t.Stop()
	var suspect int64 // the wait that looked stalled once
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		since := waitingSince.Load()
		if since == 0 || time.Since(time.Unix(0, since)) < f.cfg.StallAfter {
			suspect = 0
			continue
		}
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		info, err := cons.Info(ictx)
		cancel()
		var why error
		switch {
		case errors.Is(err, jetstream.ErrConsumerNotFound):
			why = fmt.Errorf("%w: the server no longer has it", errStalled)
		case err != nil:
			continue // the server is unreachable: a reconnect will tell
		case info.NumPending > 0 && info.NumAckPending < f.cfg.MaxAckPending:
			if suspect != since {
				suspect = since
				continue
			}
			why = fmt.Errorf("%w: %d messages pending, none delivered for %s", errStalled, info.NumPending, f.cfg.StallAfter)
		default:
			suspect = 0
			continue
		}
		stalled.Store(&why)
		stop()
		return
	}
}
