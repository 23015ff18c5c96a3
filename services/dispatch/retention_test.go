package dispatch_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/dispatch"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/prometheus/client_golang/prometheus"
)

// Given a bounded log in which every fact on the linux pool's ledger has
// expired (its last booking and release are older than what the stream
// keeps) while the dispatcher's fold still holds their sequences, when a job
// is queued and the dispatcher decides, then the slot is booked: the server
// reads the expired ledger as empty, and a booking expecting the fold's last
// ledger sequence must not conflict for ever.
func TestBookingGoesOnAfterThePoolLedgersFactsExpired(t *testing.T) {
	in := newIntake(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := eventlog.EnsureStream(ctx, in.js, eventlog.StreamConfig{MaxMsgs: 6}); err != nil {
		t.Fatal(err)
	}
	app := &eventlog.Appender{JS: in.js, Source: "test"}
	d, err := dispatch.New(&eventlog.Loop{JS: in.js}, app, &countingMinter{},
		dispatch.Options{Logger: slog.New(slog.DiscardHandler)}, dispatch.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	// put appends a fact and feeds it to the dispatcher's fold, as its loop would.
	put := func(p events.Payload, expect *uint64) uint64 {
		t.Helper()
		ev := app.New(time.Now(), p)
		seq, _, err := app.Append(ctx, ev, expect)
		if err != nil {
			t.Fatalf("append %s: %v", ev.ID, err)
		}
		ev.Seq = seq
		deliver(d, ev)
		return seq
	}
	empty := uint64(0)
	put(host("h-a", 4, 4), nil)
	put(queued(9), nil)
	booked := put(reserved(9, 1, "h-a"), &empty)
	put(completed(9, attempt(9, 1), "success"), nil)
	released := put(released(9, 1, "h-a", events.ReleaseCompleted), &booked)
	for i := range 6 { // jobs no pool serves: they only push the ledger out
		put(queued(int64(100+i), "gpu"), nil)
	}
	if n := in.stream(t, events.PoolFilter("linux")).State.Subjects[events.PoolSubject("linux")+".dispatcher"]; n != 0 {
		t.Fatalf("the linux ledger still holds %d facts: the test needs them expired", n)
	}
	if got := d.Fleet().Pools["linux"].LastSeq; got != released {
		t.Fatalf("fold's linux ledger at seq %d, want %d", got, released)
	}

	put(queued(1), nil)
	d.Decide(ctx)
	d.Decide(ctx) // a conflict is re-decided on the next turn; it must not recur

	if n := in.stream(t, events.PoolFilter("linux")).State.Subjects[events.PoolSubject("linux")+".dispatcher"]; n != 1 {
		t.Errorf("the linux ledger holds %d facts after deciding with job 1 queued, want its booking", n)
	}
}

// Given a dispatcher that compacted its fold when it first decided, when
// KeepOver+50 jobs run and end, a millisecond apart, and its clock moves on by
// events.CompactSoonest, then its next decision leaves the records of the
// newest KeepOver jobs only: once its fold has grown by KeepOver records it
// compacts before the minute is out (issue 19: at 300 jobs a second, a
// minute's jobs were 18,000 records in each fold, and every collection
// marked them).
func TestADispatcherCompactsBeforeTheMinuteOnceItsFoldGrew(t *testing.T) {
	in := newIntake(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	now := t0
	d, err := dispatch.New(&eventlog.Loop{JS: in.js}, &eventlog.Appender{JS: in.js, Source: "test"}, &countingMinter{},
		dispatch.Options{Logger: slog.New(slog.DiscardHandler), Now: func() time.Time { return now }}, dispatch.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	d.Decide(ctx) // the first decision compacts: the minute runs from here
	var seq uint64
	put := func(p events.Payload) {
		seq++
		e := events.New("test", now, p)
		e.Seq = seq
		deliver(d, e)
	}
	put(host("h-a", 8, 8))
	const jobs = events.KeepOver + 50
	for job := int64(1); job <= jobs; job++ {
		for _, p := range done(job, "h-a", "success") {
			put(p)
		}
		now = now.Add(time.Millisecond)
	}
	if n := len(d.Fleet().Jobs); n != jobs {
		t.Fatalf("the fold holds %d job records before deciding; the test needs all %d", n, jobs)
	}
	now = now.Add(events.CompactSoonest)
	d.Decide(ctx)
	if n, a := len(d.Fleet().Jobs), len(d.Fleet().Attempts); n != events.KeepOver || a != events.KeepOver {
		t.Fatalf("%s after the first decision the fold holds %d job and %d attempt records; want the newest %d of each",
			events.CompactSoonest, n, a, events.KeepOver)
	}
	if settled, _ := d.Fleet().SettledCounts(); settled != jobs-events.KeepOver {
		t.Fatalf("%d jobs settled; want the %d oldest", settled, jobs-events.KeepOver)
	}
}
