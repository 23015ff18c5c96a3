package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/nats-io/nats.go/jetstream"
)

// Stored is one fact as the server stored it: At is the server's store time
// (the JetStream message timestamp), so latencies read from the log do not
// depend on when an observer happened to see them.
type Stored struct {
	Seq  uint64
	At   time.Time
	Size int
	Ev   events.Event
}

// ReadLog reads BERTH_EVENTS from seq from to seq to (inclusive) with an
// ordered consumer and decodes every fact. It gives up after timeout.
func ReadLog(ctx context.Context, js jetstream.JetStream, from, to uint64, timeout time.Duration) ([]Stored, error) {
	if to < from {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, events.StreamName, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from})
	if err != nil {
		return nil, fmt.Errorf("read log: %w", err)
	}
	defer eventlog.DropOrdered(js, cons)
	it, err := cons.Messages(jetstream.PullMaxMessages(1024))
	if err != nil {
		return nil, fmt.Errorf("read log: %w", err)
	}
	defer it.Stop()
	out := make([]Stored, 0, to-from+1)
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return out, fmt.Errorf("read log: got %d of seqs %d..%d: %w", len(out), from, to, err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			return out, err
		}
		seq := meta.Sequence.Stream
		ev, _ := events.Unmarshal(msg.Data(), seq)
		out = append(out, Stored{Seq: seq, At: meta.Timestamp, Size: len(msg.Data()), Ev: ev})
		if seq >= to {
			return out, nil
		}
	}
}

// LastSeq is the stream's last sequence.
func LastSeq(ctx context.Context, js jetstream.JetStream) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return eventlog.LastSeq(ctx, js)
}

// Counter follows the log from a sequence and counts facts by type, read
// from the envelope without decoding it (FactType), so that phases can
// wait on conditions cheaply while the system runs.
type Counter struct {
	mu     sync.Mutex
	counts map[string]int64
	total  int64
	last   time.Time
	err    error
	stop   func()
}

// Count starts a counter from seq from (0 or 1: the beginning).
func Count(ctx context.Context, js jetstream.JetStream, from uint64) (*Counter, error) {
	c := &Counter{counts: map[string]int64{}, last: time.Now()}
	stop, err := tail(ctx, js, jetstream.OrderedConsumerConfig{}, from, func(msg jetstream.Msg, at time.Time) {
		t := FactType(msg.Data())
		c.mu.Lock()
		c.counts[t]++
		c.total++
		c.last = at
		c.mu.Unlock()
	}, func(err error) {
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
	})
	if err != nil {
		return nil, fmt.Errorf("count: %w", err)
	}
	c.stop = stop
	return c, nil
}

// tail follows the log from seq from (0 or 1: the beginning) through an
// ordered consumer (cfg's filters, if any), calling each in order for
// every message with when it was received, in its own goroutine until
// stop, which waits for it. A read error other than the stop goes to
// failed and ends the tail.
func tail(ctx context.Context, js jetstream.JetStream, cfg jetstream.OrderedConsumerConfig, from uint64,
	each func(jetstream.Msg, time.Time), failed func(error)) (stop func(), err error) {
	if from > 1 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	cons, err := js.OrderedConsumer(ctx, events.StreamName, cfg)
	if err != nil {
		return nil, err
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(1024))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	unhook := context.AfterFunc(ctx, it.Stop)
	go func() {
		defer close(done)
		defer eventlog.DropOrdered(js, cons)
		defer unhook()
		for {
			msg, err := it.Next()
			if err != nil {
				if ctx.Err() == nil && !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
					failed(err)
				}
				return
			}
			each(msg, time.Now())
		}
	}()
	return func() { cancel(); <-done }, nil
}

// Get returns how many facts of type t were seen.
func (c *Counter) Get(t string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[t]
}

// Total returns how many facts were seen, and when the last one arrived.
func (c *Counter) Total() (int64, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total, c.last
}

// Err is the follower's error, if it stopped on one.
func (c *Counter) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Stop ends the follower and waits for it.
func (c *Counter) Stop() { c.stop() }

// Settled is the lifecycle condition most phases wait for: n jobs completed,
// every reservation released and every placed attempt's VM stopped.
func (c *Counter) Settled(n int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[events.TypeJobCompleted] >= n &&
		c.counts[events.TypeSlotReleased] >= c.counts[events.TypeSlotReserved] &&
		c.counts[events.TypeAttemptStopped] >= c.counts[events.TypeAttemptPlaced]
}

// ErrStalled is returned by Wait when a phase makes no progress.
var ErrStalled = errors.New("stalled")

// Wait polls done every 20 ms until it holds. It fails when progress (any
// growing number) stays still for stall, or after timeout; status describes
// where the phase is, for the error message.
func Wait(ctx context.Context, phase string, timeout, stall time.Duration, done func() bool, progress func() int64, status func() string) error {
	start := time.Now()
	last, lastAt := progress(), time.Now()
	for !done() {
		if p := progress(); p != last {
			last, lastAt = p, time.Now()
		}
		switch {
		case ctx.Err() != nil:
			return fmt.Errorf("phase %s: %w (%s)", phase, ctx.Err(), status())
		case time.Since(lastAt) > stall:
			return fmt.Errorf("phase %s %w: no progress for %s after %s: %s", phase, ErrStalled, stall, time.Since(start).Round(time.Second), status())
		case time.Since(start) > timeout:
			return fmt.Errorf("phase %s did not finish within %s: %s", phase, timeout, status())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// typeKey opens the envelope's type: events.Marshal writes "type" before
// "data", and a key's quotes cannot occur unescaped inside the string
// values before it, so its first occurrence is the envelope's own.
var typeKey = []byte(`"type":"`)

// FactType is the CloudEvents type of a stored fact's envelope, read
// without decoding it (a bench follower sees every fact of a run); ""
// when body holds none.
func FactType(body []byte) string {
	i := bytes.Index(body, typeKey)
	if i < 0 {
		return ""
	}
	rest := body[i+len(typeKey):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return ""
	}
	return string(rest[:j])
}
