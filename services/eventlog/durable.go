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
}

// unacked tracks what was delivered and not yet acked, so a recreated
// consumer starts at the oldest of those: nothing between is lost, and what
// comes twice is harmless because every fold is idempotent.
type unacked struct {
	mu      sync.Mutex
	out     map[uint64]int // stream seq → deliveries outstanding
	highest uint64
}

func (u *unacked) delivered(seq uint64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.out[seq]++
	u.highest = max(u.highest, seq)
}

func (u *unacked) settled(seq uint64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.out[seq] <= 1 {
		delete(u.out, seq)
	} else {
		u.out[seq]--
	}
}

// resumeFrom is the sequence a recreated consumer starts at.
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
	return from
}

// follower reads the log through a durable consumer.
type follower struct {
	js    jetstream.JetStream
	cfg   Consumer
	subj  []string
	track unacked
	stats struct{ redelivered, recreated atomic.Uint64 }
	cons  atomic.Value // the live jetstream.Consumer, for Stuck
	last  atomic.Int64 // unix nanos of the last delivery
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
	return FollowerStats{Redelivered: f.stats.redelivered.Load(), Recreated: f.stats.recreated.Load()}
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
			slog.Warn("durable consumer: cannot create it yet; retrying (is NATS up and the stream there?)", "consumer", f.cfg.Name, "err", err)
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
		slog.Warn("durable consumer stalled or lost; recreating it", "consumer", f.cfg.Name, "from_seq", from, "err", err)
	}
}

// create replaces the consumer with one that starts at from. Its
// configuration cannot be changed in place (a start sequence is fixed at
// creation), so an old one is deleted first.
func (f *follower) create(ctx context.Context, from uint64) (jetstream.Consumer, error) {
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
	if from > 1 {
		cc.DeliverPolicy, cc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	return f.js.CreateConsumer(cctx, events.StreamName, cc)
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
		f.track.delivered(seq)
		ev, derr := events.Unmarshal(msg.Data(), seq)
		ev.Seq, ev.Subject = seq, msg.Subject()
		d := Delivered{Event: ev, Pending: meta.NumPending, Err: derr, Deliveries: meta.NumDelivered,
			MaxDeliver: uint64(f.cfg.MaxDeliver), msg: msg, track: &f.track}
		select {
		case out <- d:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
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
