package eventlog

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
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

// Loop feeds a Reactor from the log.
type Loop struct {
	JS      jetstream.JetStream
	Filters []string
	// Tick is how often Decide runs without new facts (deadlines); 0 means 1 s.
	Tick time.Duration

	inbox    chan func()
	once     sync.Once
	caughtUp atomic.Bool
	lastSeq  atomic.Uint64
	progress atomic.Int64 // unix nanos of the loop's last turn
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

// CaughtUp reports whether the fold has reached the end of the log once.
func (l *Loop) CaughtUp() bool { return l.caughtUp.Load() }

// LastSeq is the last stream sequence applied.
func (l *Loop) LastSeq() uint64 { return l.lastSeq.Load() }

// LastProgress is when the loop last completed a turn; a loop that makes no
// progress for several ticks is stuck and health says so.
func (l *Loop) LastProgress() time.Time { return time.Unix(0, l.progress.Load()) }

// Run follows the log from the start and drives r until ctx ends.
func (l *Loop) Run(ctx context.Context, r Reactor) error {
	l.init()
	tick := l.Tick
	if tick == 0 {
		tick = time.Second
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := make(chan Delivered, 1024)
	errc := make(chan error, 1)
	go func() { errc <- Follow(ctx, l.JS, l.Filters, 1, ch) }()
	t := time.NewTicker(tick)
	defer t.Stop()
	l.progress.Store(time.Now().UnixNano())
	// An empty log (or a filter nothing matches yet) is caught up at once
	// when the stream holds nothing; otherwise the first delivery tells.
	if last, err := LastSeq(ctx, l.JS); err == nil && last == 0 {
		l.caughtUp.Store(true)
		r.Decide(ctx) // nothing will arrive to trigger it before the first tick
	}
	quiet := 0
	for {
		decide := false
		select {
		case <-ctx.Done():
			<-errc
			return nil
		case err := <-errc:
			if ctx.Err() != nil {
				return nil // stopping: the follower saw the cancel first
			}
			return err
		case fn := <-l.inbox:
			fn()
			decide = true
		case <-t.C:
			decide = true
			// A filter that matches nothing yet delivers nothing: after two
			// quiet ticks there is nothing to catch up with.
			if quiet++; quiet >= 2 && l.lastSeq.Load() == 0 {
				l.caughtUp.Store(true)
			}
		case d := <-ch:
			r.Apply(d)
			l.lastSeq.Store(d.Event.Seq)
			if d.Pending == 0 {
				l.caughtUp.Store(true)
			}
			// Drain what is already buffered so Decide sees a batch.
			for drained := false; !drained; {
				select {
				case d := <-ch:
					r.Apply(d)
					l.lastSeq.Store(d.Event.Seq)
					if d.Pending == 0 {
						l.caughtUp.Store(true)
					}
				default:
					drained = true
				}
			}
			decide = true
		}
		if decide && l.caughtUp.Load() {
			r.Decide(ctx)
		}
		l.progress.Store(time.Now().UnixNano())
	}
}
