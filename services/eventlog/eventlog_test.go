package eventlog_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/natsembed"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testkit.LeakOptions()...) }

// waitLimit bounds every wait: far above what anything here needs.
const waitLimit = 10 * time.Second

// start runs an embedded server with the Berth stream and returns a client.
func start(t *testing.T) (*nats.Conn, jetstream.JetStream, *eventlog.Appender) {
	return startServer(t, natsembed.EmbeddedConfig{}, eventlog.StreamConfig{})
}

// startServer runs an embedded server configured by srvCfg (its listen
// address and store are the test's own) with the Berth stream per cfg.
func startServer(t *testing.T, srvCfg natsembed.EmbeddedConfig, cfg eventlog.StreamConfig) (*nats.Conn, jetstream.JetStream, *eventlog.Appender) {
	t.Helper()
	srv := testkit.Server(t, srvCfg)
	nc, js := testkit.Connect(t, srv.ClientURL())
	testkit.Stream(t, js, cfg)
	return nc, js, &eventlog.Appender{JS: js, Source: "berth/test"}
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	return ctx
}

var t0 = time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)

func queued(delivery string, job int64) events.Payload {
	return events.JobQueued{JobRef: events.JobRef{Delivery: delivery, JobID: job, RunID: 7, Labels: []string{"self-hosted", "linux"}}}
}

func TestEnsureStreamIsIdempotentAndTheLogImmutable(t *testing.T) {
	_, js, app := start(t)
	ctx := ctxFor(t)

	// Given the stream ensured a second time (every service does at start).
	s, err := eventlog.EnsureStream(ctx, js, eventlog.StreamConfig{})
	if err != nil {
		t.Fatalf("second EnsureStream: %v", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c := info.Config; !c.DenyDelete || !c.DenyPurge || c.Storage != jetstream.FileStorage ||
		len(c.Subjects) != 1 || c.Subjects[0] != events.SubjectAll {
		t.Errorf("stream config %+v: want delete and purge denied, file storage, subjects %s", c, events.SubjectAll)
	}
	seq, _, err := app.Append(ctx, app.New(t0, queued("d-1", 1)), nil)
	if err != nil {
		t.Fatal(err)
	}

	// When anyone tries to purge it or delete a fact, then the server refuses.
	if err := s.Purge(ctx); err == nil {
		t.Error("purge of the event log succeeded")
	}
	if err := s.DeleteMsg(ctx, seq); err == nil {
		t.Error("delete of a fact succeeded")
	}
	if err := s.SecureDeleteMsg(ctx, seq); err == nil {
		t.Error("secure delete of a fact succeeded")
	}
	// And the fact is still there.
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Errorf("after refused deletes the stream holds %v messages (%v), want 1", info.State.Msgs, err)
	}
}

func TestAppendingTheSameFactTwiceStoresItOnce(t *testing.T) {
	_, js, app := start(t)
	ctx := ctxFor(t)
	ev := app.New(t0, queued("d-dup", 2))

	seq1, dup1, err1 := app.Append(ctx, ev, nil)
	seq2, dup2, err2 := app.Append(ctx, ev, nil)
	if err1 != nil || err2 != nil {
		t.Fatalf("appends: %v, %v", err1, err2)
	}
	if dup1 || !dup2 || seq2 != seq1 {
		t.Errorf("first (seq %d, dup %v), retry (seq %d, dup %v): want the retry reported duplicate of the same seq", seq1, dup1, seq2, dup2)
	}
	if last, err := eventlog.LastSeq(ctx, js); err != nil || last != 1 {
		t.Errorf("stream last seq %d (%v), want one message", last, err)
	}
}

func TestAppendWithExpectedSequence(t *testing.T) {
	_, _, app := start(t)
	ctx := ctxFor(t)
	reserve := func(attempt string) events.Event {
		return app.New(t0, events.SlotReserved{Pool: "linux", Host: "h", Attempt: attempt, JobID: 1, N: 1})
	}
	ptr := func(v uint64) *uint64 { return &v }

	// Given an empty pool ledger: expecting a sequence it never had conflicts.
	if _, _, err := app.Append(ctx, reserve("berth-1-1"), ptr(5)); !errors.Is(err, eventlog.ErrConflict) {
		t.Fatalf("append expecting seq 5 on an empty subject: %v, want ErrConflict", err)
	}
	// Expecting it empty succeeds.
	seq, _, err := app.Append(ctx, reserve("berth-1-1"), ptr(0))
	if err != nil {
		t.Fatalf("append expecting an empty subject: %v", err)
	}
	// A second writer that still thinks it empty loses.
	if _, _, err := app.Append(ctx, reserve("berth-1-2"), ptr(0)); !errors.Is(err, eventlog.ErrConflict) {
		t.Fatalf("append expecting an empty subject after a write: %v, want ErrConflict", err)
	}
	// A writer that read the last sequence wins.
	if _, _, err := app.Append(ctx, reserve("berth-1-2"), ptr(seq)); err != nil {
		t.Fatalf("append expecting seq %d: %v", seq, err)
	}
}

func TestFollowSkipsMalformedMessagesAndKeepsDelivering(t *testing.T) {
	nc, js, app := start(t)
	ctx := ctxFor(t)

	// Given a good fact, raw garbage, an envelope of an unknown type, and another good fact.
	if _, _, err := app.Append(ctx, app.New(t0, queued("d-a", 1)), nil); err != nil {
		t.Fatal(err)
	}
	subject := events.JobSubject(1)
	if err := nc.Publish(subject, []byte("\x00not an event{")); err != nil {
		t.Fatal(err)
	}
	unknown := `{"specversion":"1.0","id":"x-1","source":"future","type":"berth.job.queued.v9","subject":"` + subject + `","data":{}}`
	if err := nc.Publish(subject, []byte(unknown)); err != nil {
		t.Fatal(err)
	}
	// (Same connection: the acknowledged append below is stored after both.)
	if _, _, err := app.Append(ctx, app.New(t0, queued("d-b", 1)), nil); err != nil {
		t.Fatal(err)
	}

	// When the log is followed.
	fctx, cancel := context.WithCancel(ctx)
	ch := make(chan eventlog.Delivered, 16)
	errc := make(chan error, 1)
	go func() { errc <- eventlog.Follow(fctx, js, "test-follow", []string{events.SubjectAll}, 0, ch) }()
	defer func() { cancel(); <-errc }()
	var got []eventlog.Delivered
	for len(got) < 4 {
		select {
		case d := <-ch:
			got = append(got, d)
		case <-ctx.Done():
			t.Fatalf("follower stalled after %d messages: %+v", len(got), got)
		}
	}

	// Then the bad ones arrive as errors, in place, and the good one after them.
	if got[0].Err != nil || got[0].Event.ID != "gh-d-a" {
		t.Errorf("1st: %+v, want gh-d-a", got[0])
	}
	if !errors.Is(got[1].Err, events.ErrMalformed) || got[1].Event.Seq != 2 {
		t.Errorf("2nd: err %v seq %d, want ErrMalformed at seq 2", got[1].Err, got[1].Event.Seq)
	}
	if !errors.Is(got[2].Err, events.ErrUnknownType) || got[2].Event.Seq != 3 {
		t.Errorf("3rd: err %v seq %d, want ErrUnknownType at seq 3", got[2].Err, got[2].Event.Seq)
	}
	if got[3].Err != nil || got[3].Event.ID != "gh-d-b" || got[3].Event.Seq != 4 || got[3].Pending != 0 {
		t.Errorf("4th: %+v, want gh-d-b at seq 4, nothing pending", got[3])
	}
}

func TestReplayFoldsUpToTheStreamsLastSequence(t *testing.T) {
	nc, js, app := start(t)
	ctx := ctxFor(t)

	// Given an empty log, replay is an empty fleet.
	if f, err := eventlog.Replay(ctx, js, nil); err != nil || f.LastSeq != 0 || len(f.Jobs) != 0 {
		t.Fatalf("replay of an empty log: %+v, %v", f, err)
	}
	// Given facts with a malformed message among them.
	for i, d := range []string{"d-1", "d-2", "d-3"} {
		if _, _, err := app.Append(ctx, app.New(t0, queued(d, int64(i+1))), nil); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			if err := nc.Publish(events.JobSubject(9), []byte("garbage")); err != nil {
				t.Fatal(err)
			}
		}
	}
	last, err := eventlog.LastSeq(ctx, js)
	if err != nil {
		t.Fatal(err)
	}

	// When it is replayed, then the fold reaches the stream's last sequence.
	f, err := eventlog.Replay(ctx, js, nil)
	if err != nil {
		t.Fatal(err)
	}
	if last != 4 || f.LastSeq != last {
		t.Errorf("fleet LastSeq %d, stream last seq %d: want both 4", f.LastSeq, last)
	}
	if len(f.Jobs) != 3 || f.Skipped != 1 {
		t.Errorf("fleet has %d jobs and skipped %d, want 3 jobs and the malformed one skipped", len(f.Jobs), f.Skipped)
	}
}

func TestReplayEndingInAMalformedMessageReturns(t *testing.T) {
	nc, js, app := start(t)
	ctx := ctxFor(t)
	if _, _, err := app.Append(ctx, app.New(t0, queued("d-1", 1)), nil); err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(events.JobSubject(1), []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// Poll until the raw publish is stored (it has no acknowledgement).
	testkit.Eventually(t, waitLimit, "raw publish stored", func() bool { last, _ := eventlog.LastSeq(ctx, js); return last == 2 })
	f, err := eventlog.Replay(ctx, js, nil)
	if err != nil || len(f.Jobs) != 1 || f.Skipped != 1 {
		t.Fatalf("replay: %d jobs, %d skipped, %v; want 1 job, 1 skipped, no error", len(f.Jobs), f.Skipped, err)
	}
}

// reactor records what a Loop feeds it.
type reactor struct {
	mu      sync.Mutex
	applied []uint64
	decides chan int // applied count at each Decide
}

func newReactor() *reactor { return &reactor{decides: make(chan int, 1024)} }

func (r *reactor) Apply(d eventlog.Delivered) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.applied = append(r.applied, d.Event.Seq)
}

func (r *reactor) Decide(context.Context) {
	r.mu.Lock()
	n := len(r.applied)
	r.mu.Unlock()
	select {
	case r.decides <- n:
	default:
	}
}

// run runs the loop until cleanup.
func run(t *testing.T, l *eventlog.Loop, r *reactor) {
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

func nextDecide(t *testing.T, r *reactor) int {
	t.Helper()
	select {
	case n := <-r.decides:
		return n
	case <-time.After(waitLimit):
		t.Fatalf("Decide not called within %v", waitLimit)
		return 0
	}
}

func TestLoopDecidesOnceCaughtUpOnAnEmptyLog(t *testing.T) {
	_, js, _ := start(t)
	// Given an empty log and a tick too long to be what triggers Decide.
	l := &eventlog.Loop{JS: js, Filters: []string{events.SubjectAll}, Tick: time.Hour}
	r := newReactor()
	run(t, l, r)

	// Then Decide runs, caught up, with nothing applied.
	if n := nextDecide(t, r); n != 0 || !l.CaughtUp() {
		t.Errorf("first Decide saw %d facts, caught up %v; want 0, true", n, l.CaughtUp())
	}
}

func TestLoopDecidesOnlyAfterCatchingUp(t *testing.T) {
	_, js, app := start(t)
	ctx := ctxFor(t)
	// Given a log with several facts.
	for i, d := range []string{"d-1", "d-2", "d-3", "d-4"} {
		if _, _, err := app.Append(ctx, app.New(t0, queued(d, int64(i+1))), nil); err != nil {
			t.Fatal(err)
		}
	}
	l := &eventlog.Loop{JS: js, Filters: []string{events.SubjectAll}, Tick: time.Hour}
	r := newReactor()
	run(t, l, r)

	// Then the first Decide sees the whole log, never a partial fold.
	if n := nextDecide(t, r); n != 4 || l.LastSeq() != 4 {
		t.Errorf("first Decide saw %d facts (loop at seq %d), want all 4", n, l.LastSeq())
	}
	// And Post runs on the loop and is followed by a Decide.
	posted := make(chan struct{})
	l.Post(ctx, func() { close(posted) })
	select {
	case <-posted:
	case <-ctx.Done():
		t.Fatal("posted function never ran")
	}
	nextDecide(t, r)
}

func TestLoopWithAFilterNothingMatchesStillCatchesUp(t *testing.T) {
	_, js, app := start(t)
	ctx := ctxFor(t)
	// Given a log whose facts are all outside the loop's filter.
	if _, _, err := app.Append(ctx, app.New(t0, queued("d-1", 1)), nil); err != nil {
		t.Fatal(err)
	}
	l := &eventlog.Loop{JS: js, Filters: []string{events.HostSubject("nobody")}, Tick: 20 * time.Millisecond}
	r := newReactor()
	run(t, l, r)

	// Then after quiet ticks it counts as caught up and decides.
	if n := nextDecide(t, r); n != 0 || !l.CaughtUp() {
		t.Errorf("Decide saw %d facts, caught up %v; want 0, true", n, l.CaughtUp())
	}
}

// Given a follower of the log, when its context ends, then its ordered
// consumer is gone from the server at once, not after nats.go's 5-minute
// inactive threshold (each one holds three server goroutines; the bench
// saw them counted as retained after every run).
func TestAFollowerLeavesNoConsumerBehind(t *testing.T) {
	_, js, app := start(t)
	appendQueued(t, app, "d-1", 1)
	ctx, cancel := context.WithCancel(ctxFor(t))
	out := make(chan eventlog.Delivered, 8)
	done := make(chan error, 1)
	go func() { done <- eventlog.Follow(ctx, js, "test-follow-2", []string{events.SubjectAll}, 0, out) }()
	select {
	case <-out:
	case <-time.After(waitLimit):
		t.Fatal("the follower delivered nothing")
	}
	s, err := js.Stream(ctxFor(t), events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if n := consumers(t, s); n != 1 {
		t.Fatalf("%d consumers while following, want 1", n)
	}
	cancel()
	<-done
	if n := consumers(t, s); n != 0 {
		t.Errorf("%d consumers left after the follower stopped, want 0", n)
	}
}

func consumers(t *testing.T, s jetstream.Stream) int {
	t.Helper()
	n := 0
	for range s.ListConsumers(ctxFor(t)).Info() {
		n++
	}
	return n
}

// Given facts stored by Append (with and without an expected sequence) and
// by AppendAll, when the stream's copy is read back, then each carries the
// Nats-Msg-Id the server deduplicates by and the Nats-Expected-* checks
// the server made, and no other header: every reader is sent each stored
// header with every fact, and a direct get (every replay, `berth events`)
// makes the server rebuild the header block once per header it adds. A
// Ce-Type header repeated the envelope's type until 2026-12-07; with it a
// replay of 200,020 facts stored as the services store them ran at
// 68–85,000 facts/s, without it at 83–101,000 (eight rounds each, one
// machine, one session).
func TestAStoredFactCarriesNoHeaderItsReadersDoNotNeed(t *testing.T) {
	_, js, app := start(t)
	ctx := ctxFor(t)
	zero := uint64(0)
	queuedEv := app.New(t0, queued("d-headers", 3))
	reserved := app.New(t0, events.SlotReserved{Pool: "linux", Host: "h", Attempt: "berth-3-1", JobID: 3, N: 1})
	var seqs []uint64
	for _, a := range []struct {
		ev     events.Event
		expect *uint64
	}{{queuedEv, nil}, {reserved, &zero}} {
		seq, _, err := app.Append(ctx, a.ev, a.expect)
		if err != nil {
			t.Fatalf("append %s: %v", a.ev.Type(), err)
		}
		seqs = append(seqs, seq)
	}
	all := app.AppendAll(ctx, []events.Event{app.New(t0, queued("d-headers-2", 4))})
	if all[0].Err != nil {
		t.Fatalf("append all: %v", all[0].Err)
	}
	seqs = append(seqs, all[0].Seq)
	allowed := map[string]bool{jetstream.MsgIDHeader: true, jetstream.ExpectedStreamHeader: true,
		jetstream.ExpectedLastSubjSeqHeader: true, jetstream.ExpectedLastSubjSeqSubjHeader: true,
		// what a direct get adds to the stored ones (GetMsg reads by one)
		jetstream.StreamHeader: true, jetstream.SubjectHeader: true, jetstream.SequenceHeader: true, jetstream.TimeStampHeaer: true}
	s, err := js.Stream(ctx, events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	for _, seq := range seqs {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("get seq %d: %v", seq, err)
		}
		ev, err := events.Unmarshal(m.Data, seq)
		if err != nil || ev.Type() == "" {
			t.Fatalf("seq %d: the body does not give the fact's type: %v", seq, err)
		}
		for k := range m.Header {
			if !allowed[k] {
				t.Errorf("seq %d (%s) is stored with header %s: %q; a reader needs none but the envelope", seq, ev.Type(), k, m.Header.Get(k))
			}
		}
		if got := m.Header.Get(jetstream.MsgIDHeader); got != eventlog.MsgID(ev) {
			t.Errorf("seq %d stored under Nats-Msg-Id %q, want %q", seq, got, eventlog.MsgID(ev))
		}
	}
}
