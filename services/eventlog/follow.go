package eventlog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/nats-io/nats.go/jetstream"
)

// Delivered is one stored fact as a follower sees it. Pending is how many
// more matching facts the server holds after it (0: caught up). Err is set,
// with ErrMalformed or ErrUnknownType, when the message could not be decoded,
// or with ErrPoison when reacting to it failed MaxDeliver times: such
// messages are skipped and counted, never fatal.
type Delivered struct {
	Event   events.Event
	Pending uint64
	Err     error
	// Deliveries is how often the server has delivered this message through
	// a durable consumer (1 the first time); 0 from an ordered follower.
	Deliveries uint64
	// MaxDeliver is the consumer's limit on Deliveries (0: no redelivery).
	MaxDeliver uint64

	msg   jetstream.Msg
	track *unacked
}

// ErrPoison marks a fact whose reaction panicked on every delivery: it is
// parked (see events.BucketParked) and the fold skips it.
var ErrPoison = errors.New("poison event: the reaction failed on every delivery")

// ack tells the server the fact is folded and reacted to.
func (d Delivered) ack() {
	if d.msg != nil {
		_ = d.msg.Ack()
		d.track.settled(d.Event.Seq)
	}
}

// retry asks for a redelivery after delay.
func (d Delivered) retry(delay time.Duration) {
	if d.msg != nil {
		_ = d.msg.NakWithDelay(delay)
		d.track.retrying(d.Event.Seq)
	}
}

// working resets the server's AckWait while a long reaction runs.
func (d Delivered) working() {
	if d.msg != nil {
		_ = d.msg.InProgress()
	}
}

// drop tells the server never to deliver the fact again.
func (d Delivered) drop(reason string) {
	if d.msg != nil {
		_ = d.msg.TermWithReason(reason)
		d.track.settled(d.Event.Seq)
	}
}

// Follow reads the log in order from startSeq (1 or 0: the beginning)
// through a consumer of the given exact name filtered to filters, and sends
// every message to out until ctx ends. It acknowledges nothing: a delivery
// lost on the way shows as a gap in the consumer's sequence, and the
// consumer is recreated after the last fact received, as an ordered
// consumer would be; but under a name the reader's NATS permissions grant
// it alone (an ordered consumer's name changes with every recreation, so no
// permission could name it). The consumer is deleted when ctx ends.
func Follow(ctx context.Context, js jetstream.JetStream, name string, filters []string, startSeq uint64, out chan<- Delivered) error {
	f := newFollower(js, Consumer{Name: name, ackNone: true}, filters)
	return f.run(ctx, startSeq, out)
}

// DropOrdered deletes an ordered consumer on the server once its reader is
// done. nats.go leaves it to its inactive threshold (5 min), holding three
// server goroutines and its state, so every follow, replay and
// `status --watch` would leave one behind for minutes. Best effort: the
// threshold still removes it if this fails.
func DropOrdered(js jetstream.JetStream, cons jetstream.Consumer) {
	dropOrdered(cons, func(ctx context.Context, info *jetstream.ConsumerInfo) error {
		return js.DeleteConsumer(ctx, info.Stream, info.Name)
	})
}

func dropOrdered(cons jetstream.Consumer, del func(context.Context, *jetstream.ConsumerInfo) error) {
	info := cons.CachedInfo()
	if info == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = del(ctx, info)
}

// LastSeq returns the stream's last sequence (0 when empty).
func LastSeq(ctx context.Context, js jetstream.JetStream) (uint64, error) {
	s, err := js.Stream(ctx, events.StreamName)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w (has any Berth service started against this NATS?)", events.StreamName, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.LastSeq, nil
}

// Replay folds the whole log (up to the sequence that was last when it
// started) into a fresh projection. progress, when not nil, is called every
// 1,000 events with (done, total).
func Replay(ctx context.Context, js jetstream.JetStream, progress func(done, total uint64)) (*events.Fleet, error) {
	return ReplayTo(ctx, js, 0, time.Time{}, progress)
}

// ReplayTo folds the log up to and including sequence upto (0: the last
// sequence when it starts), stopping before the first event stamped after
// until (zero: no time limit): the fleet as it was then. It folds from the
// first fact, so on a log whose oldest facts expired it fails with
// ErrTruncated; ReplayFrom starts from a snapshot instead.
func ReplayTo(ctx context.Context, js jetstream.JetStream, upto uint64, until time.Time, progress func(done, total uint64)) (*events.Fleet, error) {
	f := events.NewFleet()
	last, err := LastSeq(ctx, js)
	if err != nil || last == 0 {
		return f, err
	}
	if upto != 0 && upto < last {
		last = upto
	}
	return foldTail(ctx, js, f, 1, last, until, progress)
}

// foldSafely applies e, admitted already (events.Admit), and turns a
// panic into an error, so one poison fact cannot stop a replay: it is
// skipped like an undecodable one.
func foldSafely(f *events.Fleet, e events.Event) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %v", ErrPoison, p)
		}
	}()
	f.Apply(e)
	return nil
}
