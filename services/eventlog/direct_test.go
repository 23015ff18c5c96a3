package eventlog_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/nats-io/nats.go/jetstream"
)

// Given a log of more facts than one direct get answers (1,000), some on
// another aggregate, when Scan reads a job filter, then it yields every
// matching fact once, in log order, with its stored subject; a range stops
// at its end; a filter that matches nothing yields nothing and no error;
// and reading made no consumer on the stream (the cli role holds no right
// to make one).
func TestScanReadsTheLogInOrderWithoutAConsumer(t *testing.T) {
	_, js, app := start(t)
	const jobs = 1203
	var jobSeqs []uint64
	for i := range jobs {
		jobSeqs = append(jobSeqs, appendQueued(t, app, fmt.Sprintf("d-%d", i), int64(1000+i)))
		if i%400 == 0 {
			if _, _, err := app.Append(ctxFor(t), app.New(t0, events.HostOnline{Host: "host-a", PhysicalCap: 2}), nil); err != nil {
				t.Fatal(err)
			}
		}
	}

	var got []uint64
	next, err := eventlog.Scan(ctxFor(t), js, events.SubjectPrefix+".job.>", 1, 0, func(d eventlog.Delivered) error {
		if d.Err != nil {
			return d.Err
		}
		if q, ok := d.Event.Data.(*events.JobQueued); !ok || d.Event.Subject != events.JobSubject(q.JobID) {
			return fmt.Errorf("seq %d: %T on %s", d.Event.Seq, d.Event.Data, d.Event.Subject)
		}
		got = append(got, d.Event.Seq)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != jobs || fmt.Sprint(got) != fmt.Sprint(jobSeqs) {
		t.Fatalf("scanned %d job facts, want %d in log order", len(got), jobs)
	}
	if next != jobSeqs[jobs-1]+1 {
		t.Errorf("next scan from %d, want %d", next, jobSeqs[jobs-1]+1)
	}

	var ranged []uint64
	if _, err := eventlog.Scan(ctxFor(t), js, events.SubjectAll, 10, 20, func(d eventlog.Delivered) error {
		ranged = append(ranged, d.Event.Seq)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(ranged) != 11 || ranged[0] != 10 || ranged[10] != 20 {
		t.Errorf("seq 10..20 scanned as %v", ranged)
	}

	// The whole log (sent to the server without a filter) across pages
	// read one ahead: every fact once, in order, and a reader's error stops
	// the scan at the fact it refused.
	var all []uint64
	if _, err := eventlog.Scan(ctxFor(t), js, events.SubjectAll, 1, 0, func(d eventlog.Delivered) error {
		all = append(all, d.Event.Seq)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if last := jobSeqs[jobs-1]; uint64(len(all)) != last || all[0] != 1 || all[len(all)-1] != last {
		t.Errorf("the whole log scanned as %d facts (%d..%d), want 1..%d", len(all), all[0], all[len(all)-1], last)
	}
	refuse := errors.New("enough")
	stopAt, err := eventlog.Scan(ctxFor(t), js, events.SubjectAll, 1, 0, func(d eventlog.Delivered) error {
		if d.Event.Seq == 1100 {
			return refuse
		}
		return nil
	})
	if !errors.Is(err, refuse) || stopAt != 1100 {
		t.Errorf("a reader refusing seq 1100: next %d, err %v; want 1100 and its error", stopAt, err)
	}

	n, err := eventlog.Scan(ctxFor(t), js, events.PoolFilter("nowhere"), 1, 0, func(eventlog.Delivered) error {
		return errors.New("a fact for a filter that matches nothing")
	})
	if err != nil || n != 1 {
		t.Errorf("an empty filter: next %d, err %v; want 1 and nil", n, err)
	}

	s, err := js.Stream(ctxFor(t), events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := s.Info(ctxFor(t)); err != nil || info.State.Consumers != 0 {
		t.Errorf("the stream holds %v consumers after scanning (err %v), want 0", info.State.Consumers, err)
	}
}

// Given a follower under an exact name, while it follows the log its
// consumer has that name and acknowledges nothing, and it delivers what is
// appended; once its context ends the consumer is gone.
func TestFollowReadsUnderItsOwnNameAndLeavesNothing(t *testing.T) {
	_, js, app := start(t)
	first := appendQueued(t, app, "d-1", 1)
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan eventlog.Delivered, 16)
	done := make(chan error, 1)
	go func() { done <- eventlog.Follow(ctx, js, "berth-hostwatch-test", []string{events.SubjectAll}, 1, ch) }()
	next := func() eventlog.Delivered {
		t.Helper()
		select {
		case d := <-ch:
			return d
		case <-time.After(waitLimit):
			t.Fatal("nothing delivered")
		}
		return eventlog.Delivered{}
	}
	if d := next(); d.Event.Seq != first {
		t.Fatalf("first delivery seq %d, want %d", d.Event.Seq, first)
	}
	info := consumerInfo(t, js, "berth-hostwatch-test")
	if info.Config.AckPolicy != jetstream.AckNonePolicy {
		t.Errorf("the follower's consumer acks %v, want none", info.Config.AckPolicy)
	}
	second := appendQueued(t, app, "d-2", 2)
	if d := next(); d.Event.Seq != second {
		t.Fatalf("second delivery seq %d, want %d", d.Event.Seq, second)
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if _, err := js.Consumer(ctxFor(t), events.StreamName, "berth-hostwatch-test"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("the follower's consumer outlived it: %v", err)
	}
}

// Given a process reading through a consumer under its name (a replica
// with instance "1"), when a second process with the same name starts,
// then it refuses to take the consumer over (ErrConsumerInUse: they would
// split the log), and the first keeps reading; once the first is gone, the
// name is free again and a restart takes it at once.
func TestASecondReaderUnderTheSameNameIsRefused(t *testing.T) {
	defer eventlog.SetInUseLooks(6, 200*time.Millisecond)()
	_, js, app := start(t)
	appendQueued(t, app, "d-1", 1)
	ctx1, stop1 := context.WithCancel(context.Background())
	ch1 := make(chan eventlog.Delivered, 16)
	done1 := make(chan error, 1)
	go func() { done1 <- eventlog.Follow(ctx1, js, "berth-dispatcher-1", []string{events.SubjectAll}, 1, ch1) }()
	select {
	case <-ch1:
	case <-time.After(waitLimit):
		t.Fatal("the first reader got nothing")
	}
	testkit.Eventually(t, waitLimit, "the first reader has a pull waiting", func() bool {
		return consumerInfo(t, js, "berth-dispatcher-1").NumWaiting > 0
	})

	ch2 := make(chan eventlog.Delivered, 16)
	err := eventlog.Follow(ctxFor(t), js, "berth-dispatcher-1", []string{events.SubjectAll}, 1, ch2)
	if !errors.Is(err, eventlog.ErrConsumerInUse) {
		t.Fatalf("a second reader under the same name: %v, want ErrConsumerInUse", err)
	}
	seq := appendQueued(t, app, "d-2", 2)
	select {
	case d := <-ch1:
		if d.Event.Seq != seq {
			t.Errorf("the first reader got seq %d, want %d", d.Event.Seq, seq)
		}
	case <-time.After(waitLimit):
		t.Fatal("the first reader stopped reading")
	}

	stop1()
	<-done1
	ctx3, stop3 := context.WithCancel(context.Background())
	defer stop3()
	ch3 := make(chan eventlog.Delivered, 16)
	go func() { _ = eventlog.Follow(ctx3, js, "berth-dispatcher-1", []string{events.SubjectAll}, 1, ch3) }()
	select {
	case <-ch3:
	case <-time.After(waitLimit):
		t.Fatal("a restart under a free name got nothing")
	}
}

// Given a log of several pages, when the scan's context is cancelled while
// the reader is on the first page (the next is already fetched, one
// ahead), then Scan returns the context's error and no later fact: a
// cancelled scan never looks complete. Its pages were read one ahead by a
// goroutine that could drop the error, and a replay cut short by Ctrl-C or
// a deadline came back as a whole fold about half the time.
func TestACancelledScanSaysSo(t *testing.T) {
	_, js, app := start(t)
	for i := range 2500 {
		appendQueued(t, app, fmt.Sprintf("c-%d", i), int64(5000+i))
	}
	for round := range 20 {
		ctx, cancel := context.WithCancel(ctxFor(t))
		var last uint64
		next, err := eventlog.Scan(ctx, js, events.SubjectAll, 1, 0, func(d eventlog.Delivered) error {
			last = d.Event.Seq
			if d.Event.Seq == 500 {
				cancel()
			}
			return nil
		})
		cancel()
		if !errors.Is(err, context.Canceled) || last > 1000 || next != last+1 {
			t.Fatalf("round %d: a scan cancelled at seq 500 returned %v, next %d, having read up to seq %d; want context.Canceled and nothing past its page (seq 1000)",
				round, err, next, last)
		}
	}
}
