package eventlog_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/natsembed"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/nats-io/nats.go/jetstream"
)

// startWith runs an embedded server with the Berth stream ensured to cfg.
func startWith(t *testing.T, cfg eventlog.StreamConfig) (jetstream.JetStream, *eventlog.Appender) {
	t.Helper()
	_, js, app := startServer(t, natsembed.EmbeddedConfig{}, cfg)
	return js, app
}

func streamState(t *testing.T, js jetstream.JetStream) jetstream.StreamState {
	t.Helper()
	s, err := js.Stream(ctxFor(t), events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().State
}

// history appends facts and keeps every one, decoded as a follower sees it,
// so the test can fold all facts ever appended, expired ones included.
type history struct {
	t      *testing.T
	app    *eventlog.Appender
	kept   []events.Event
	ledger map[string]uint64 // pool → last sequence on its ledger
	jobs   int64
}

func newHistory(t *testing.T, app *eventlog.Appender) *history {
	return &history{t: t, app: app, ledger: map[string]uint64{}}
}

func (h *history) add(p events.Payload) uint64 {
	h.t.Helper()
	ev := h.app.New(time.Now().UTC(), p)
	var expect *uint64
	pool := ""
	switch v := p.(type) {
	case events.SlotReserved:
		pool = v.Pool
	case events.SlotReleased:
		pool = v.Pool
	}
	if pool != "" {
		e := h.ledger[pool]
		expect = &e
	}
	seq, _, err := h.app.Append(ctxFor(h.t), ev, expect)
	if err != nil {
		h.t.Fatalf("append %s: %v", ev.ID, err)
	}
	if pool != "" {
		h.ledger[pool] = seq
	}
	b, err := events.Marshal(ev)
	if err != nil {
		h.t.Fatal(err)
	}
	stored, err := events.Unmarshal(b, seq)
	if err != nil {
		h.t.Fatal(err)
	}
	stored.Seq, stored.Subject = seq, ev.Subject
	h.kept = append(h.kept, stored)
	return seq
}

// host brings a host online: a fact written once, which expires first.
func (h *history) host(name string) events.HostOnline {
	online := events.HostOnline{Host: name, Boot: "b1", Pools: map[string]events.PoolSlots{"linux": {Labels: []string{"linux", "self-hosted"}, Slots: 4}},
		PhysicalCap: 4, CurveKey: "XKEY", Backend: "exec", At: time.Now().UTC()}
	h.add(online)
	return online
}

// granted brings a host online with the admin's grant of what it claims,
// both written once, first to expire.
func (h *history) granted(name string) {
	h.add(events.GrantClaim(h.host(name)))
}

// job writes a job's booking facts; done jobs are completed and released,
// the others keep their slot.
func (h *history) job(host string, done bool) {
	h.jobs++
	id := h.jobs
	ref := events.JobRef{Delivery: fmt.Sprintf("d-%d", id), JobID: id, RunID: 7, Labels: []string{"self-hosted", "linux"}}
	attempt := events.AttemptID(id, 1)
	h.add(events.JobQueued{JobRef: ref})
	h.add(events.SlotReserved{Pool: "linux", Host: host, Attempt: attempt, JobID: id, N: 1, Labels: ref.Labels})
	if done {
		ref.Delivery = fmt.Sprintf("d-%d-done", id)
		h.add(events.JobCompleted{JobRef: ref, Conclusion: "success", RunnerName: attempt})
		h.add(events.SlotReleased{Pool: "linux", Host: host, Attempt: attempt, Reason: events.ReleaseCompleted, JobID: id})
	}
}

// fold is the fold of every fact ever appended, as snapshot bytes (equal
// folds give equal bytes).
func (h *history) fold() []byte {
	f := events.NewFleet()
	for _, ev := range h.kept {
		f.Apply(ev)
	}
	return snapBytes(h.t, f)
}

func snapBytes(t *testing.T, f *events.Fleet) []byte {
	t.Helper()
	b, err := events.MarshalSnapshot(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (r *foldReactor) bytes(t *testing.T) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return snapBytes(t, r.fleet)
}

// service is a Loop over a foldReactor that snapshots often.
type service struct {
	loop *eventlog.Loop
	r    *foldReactor
	stop func()
}

func startService(t *testing.T, js jetstream.JetStream, key string) *service {
	t.Helper()
	s := &service{r: &foldReactor{fleet: events.NewFleet()},
		loop: &eventlog.Loop{JS: js, Filters: []string{events.SubjectAll}, Tick: 20 * time.Millisecond,
			SnapshotKey: key, SnapshotEvery: 20 * time.Millisecond}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.loop.Run(ctx, s.r) }()
	var once bool
	s.stop = func() {
		if once {
			return
		}
		once = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("loop: %v", err)
			}
		case <-time.After(waitLimit):
			t.Errorf("loop did not stop within %v", waitLimit)
		}
	}
	t.Cleanup(s.stop)
	return s
}

func (s *service) waitApplied(t *testing.T, seq uint64) {
	t.Helper()
	testkit.Eventually(t, waitLimit, fmt.Sprintf("service folds up to seq %d", seq), func() bool {
		_, _, last, _ := s.r.state()
		return last >= seq
	})
}

func waitSnapshot(t *testing.T, js jetstream.JetStream, key string, seq uint64) {
	t.Helper()
	testkit.Eventually(t, waitLimit, fmt.Sprintf("snapshot %q covers seq %d", key, seq), func() bool {
		kv, err := js.KeyValue(ctxFor(t), events.BucketSnapshots)
		if err != nil {
			return false
		}
		b, err := eventlog.GetSnapshot(ctxFor(t), kv, key)
		if err != nil {
			return false
		}
		f, err := events.UnmarshalSnapshot(b)
		return err == nil && f.LastSeq >= seq
	})
}

func TestEnsureStreamSetsRetentionAndUpdatesAnExistingStreamInPlace(t *testing.T) {
	js, app := startWith(t, eventlog.StreamConfig{})
	ctx := ctxFor(t)
	for i := range 10 {
		if _, _, err := app.Append(ctx, app.New(t0, queued(fmt.Sprintf("d-%d", i), int64(i+1))), nil); err != nil {
			t.Fatal(err)
		}
	}
	// Given a stream of 10 facts created without limits, when it is ensured
	// again with limits (a new config at the next start).
	s, err := eventlog.EnsureStream(ctx, js, eventlog.StreamConfig{MaxAge: time.Hour, MaxBytes: 1 << 20, MaxMsgs: 6})
	if err != nil {
		t.Fatalf("update with limits: %v", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Then the stream has them, still denies delete and purge, and dropped
	// the oldest facts at once.
	c := info.Config
	if c.MaxAge != time.Hour || c.MaxBytes != 1<<20 || c.MaxMsgs != 6 || c.Retention != jetstream.LimitsPolicy ||
		c.Discard != jetstream.DiscardOld || !c.DenyDelete || !c.DenyPurge {
		t.Errorf("config %+v: want max age 1h, 1 MiB, 6 msgs, limits retention, discard old, delete and purge denied", c)
	}
	if info.State.Msgs != 6 || info.State.FirstSeq != 5 || info.State.LastSeq != 10 {
		t.Errorf("state %+v: want the 6 newest facts, seq 5..10", info.State)
	}
	if err := s.Purge(ctx); err == nil {
		t.Error("purge succeeded on a stream with limits")
	}
	// And ensuring it with no limits lifts them.
	s, err = eventlog.EnsureStream(ctx, js, eventlog.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if c := s.CachedInfo().Config; c.MaxAge != 0 || c.MaxBytes != -1 || c.MaxMsgs != -1 {
		t.Errorf("limits not lifted: max age %v, max bytes %d, max msgs %d", c.MaxAge, c.MaxBytes, c.MaxMsgs)
	}
	// A max age under the default duplicate window shortens the window; a
	// window given longer than the age is refused with what to change.
	s, err = eventlog.EnsureStream(ctx, js, eventlog.StreamConfig{MaxAge: 10 * time.Second})
	if err != nil || s.CachedInfo().Config.Duplicates != 10*time.Second {
		t.Errorf("max age 10s: %v, duplicates %v; want the window shortened to 10s", err, s.CachedInfo().Config.Duplicates)
	}
	if _, err := eventlog.EnsureStream(ctx, js, eventlog.StreamConfig{MaxAge: time.Second, DuplicateWindow: time.Minute}); err == nil {
		t.Error("a duplicate window longer than the max age was accepted")
	}
}

// Given a service folding a log bounded by message count, when facts it has
// folded and snapshotted expire (the host's online fact among them) and it
// restarts, then it comes back through its snapshot with the fold it had,
// folds the tail, and ends equal to a fold of every fact ever appended;
// a fold of what the log still holds would have lost the host.
func TestRestartAfterOldFactsExpiredComesBackThroughTheSnapshot(t *testing.T) {
	js, app := startWith(t, eventlog.StreamConfig{MaxMsgs: 25})
	h := newHistory(t, app)
	first := startService(t, js, "test")
	// Following the head before the history is written: the history
	// overruns the stream's cap, and a fold that starts late would only
	// ever see the newest 25 facts.
	testkit.Eventually(t, waitLimit, "first service caught up with the empty log", first.loop.CaughtUp)
	// Caught up with an empty log is at once, before its consumer is made:
	// one made after 37 facts were written starts at the 13th, the oldest
	// the stream still holds (under load, 1 run in 8 did).
	testkit.Eventually(t, waitLimit, "first service's consumer made", func() bool { return streamState(t, js).Consumers > 0 })
	h.granted("host-a")
	for i := range 14 {
		h.job("host-a", i%3 != 0)
		first.waitApplied(t, h.last()) // a reader 25 facts behind would miss some (1 run in 6 under load did)
	}
	last := h.kept[len(h.kept)-1].Seq
	first.waitApplied(t, last)
	waitSnapshot(t, js, "test", last)
	first.stop() // saves a last snapshot
	if st := streamState(t, js); st.FirstSeq <= 1 || st.Msgs != 25 {
		t.Fatalf("stream state %+v: want old facts expired, 25 kept", st)
	}
	if why := first.loop.Truncated(); why != "" {
		t.Fatalf("the first service folded a truncated log: %s", why)
	}
	had := first.r.bytes(t)
	if want := h.fold(); !bytes.Equal(had, want) {
		t.Fatalf("first run's fold differs from the fold of every fact:\n got %s\nwant %s", had, want)
	}

	// When it restarts with nothing new, then it has the fold it had.
	second := startService(t, js, "test")
	testkit.Eventually(t, waitLimit, "restarted service caught up", second.loop.CaughtUp)
	if got := second.r.bytes(t); !bytes.Equal(got, had) {
		t.Errorf("after restart:\n got %s\nwant %s", got, had)
	}
	second.stop()

	// When more facts come while it is down (fewer than would expire what
	// its snapshot covers) and it restarts, then it folds the tail.
	for range 3 {
		h.job("host-a", true)
	}
	third := startService(t, js, "test")
	third.waitApplied(t, h.kept[len(h.kept)-1].Seq)
	applied, restored, _, st := third.r.state()
	if restored != last || applied != 12 {
		t.Errorf("restored seq %d and applied %d; want %d and the 12-fact tail", restored, applied, last)
	}
	if got, want := third.r.bytes(t), h.fold(); !bytes.Equal(got, want) {
		t.Errorf("snapshot + tail differs from the fold of every fact:\n got %s\nwant %s", got, want)
	}
	if len(st.Pools) != 1 || st.Pools[0].Capacity != 4 {
		t.Errorf("pools %+v: want linux with host-a's 4 slots, whose online fact expired", st.Pools)
	}
	// (Without the snapshot the retained log alone does not know the slots.)
	tail := events.NewFleet()
	for _, ev := range h.kept {
		if ev.Seq >= streamState(t, js).FirstSeq {
			tail.Apply(ev)
		}
	}
	if c := tail.Capacity("linux"); c != 0 {
		t.Errorf("the retained tail alone gives linux %d slots: the test does not exercise expiry", c)
	}
}

// Given a log bounded by age (NATS accepts 100ms and up), when a running
// service's folded facts age out and more arrive, then a restart comes back
// through the snapshot equal to the fold of every fact.
func TestRestartAfterFactsAgedOutComesBackThroughTheSnapshot(t *testing.T) {
	const age = time.Second
	js, app := startWith(t, eventlog.StreamConfig{MaxAge: age})
	h := newHistory(t, app)
	first := startService(t, js, "test")
	h.host("host-a")
	for i := range 5 {
		h.job("host-a", i%2 == 0)
	}
	aged := h.kept[len(h.kept)-1].Seq
	first.waitApplied(t, aged)
	waitSnapshot(t, js, "test", aged)
	testkit.Eventually(t, waitLimit, "the first facts age out", func() bool { return streamState(t, js).FirstSeq > aged })
	for range 3 {
		h.job("host-a", false)
	}
	first.waitApplied(t, h.kept[len(h.kept)-1].Seq)
	first.stop()

	second := startService(t, js, "test")
	testkit.Eventually(t, waitLimit, "restarted service caught up", second.loop.CaughtUp)
	second.waitApplied(t, h.kept[len(h.kept)-1].Seq)
	if got, want := second.r.bytes(t), h.fold(); !bytes.Equal(got, want) {
		t.Errorf("after restart:\n got %s\nwant %s", got, want)
	}
	if st := streamState(t, js); st.FirstSeq <= 1 {
		t.Errorf("stream %+v: nothing aged out", st)
	}
}

// The ledger hazard: slot bookings are appended expecting the pool ledger's
// last sequence from the fold. Given every fact on a pool's ledger expired,
// the server reads the subject as empty (last sequence 0) while the fold
// still holds the expired fact's sequence: without Append's re-read every
// booking and release on that pool would conflict for ever.
func TestBookingOnAPoolLedgerWhoseFactsExpiredSucceeds(t *testing.T) {
	js, app := startWith(t, eventlog.StreamConfig{MaxMsgs: 5})
	ctx := ctxFor(t)
	reserve := func(pool, attempt string) events.Event {
		return app.New(t0, events.SlotReserved{Pool: pool, Host: "h", Attempt: attempt, JobID: 1, N: 1})
	}
	ptr := func(v uint64) *uint64 { return &v }
	booked, _, err := app.Append(ctx, reserve("linux", "berth-1-1"), ptr(0))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		if _, _, err := app.Append(ctx, app.New(t0, queued(fmt.Sprintf("d-%d", i), int64(i+10))), nil); err != nil {
			t.Fatal(err)
		}
	}
	if st := streamState(t, js); st.FirstSeq <= booked {
		t.Fatalf("stream %+v: the booking at seq %d has not expired", st, booked)
	}

	// When the next booking expects the fold's last ledger sequence, then
	// it is stored (and chains: the one after expects it).
	seq, _, err := app.Append(ctx, reserve("linux", "berth-2-1"), ptr(booked))
	if err != nil {
		t.Fatalf("booking on a ledger whose facts expired: %v; want it stored", err)
	}
	if _, _, err := app.Append(ctx, reserve("linux", "berth-3-1"), ptr(seq)); err != nil {
		t.Fatalf("next booking chained on seq %d: %v", seq, err)
	}
	// And a writer still expecting the expired fact now loses: the ledger
	// moved, that is a real conflict.
	if _, _, err := app.Append(ctx, reserve("linux", "berth-4-1"), ptr(booked)); !errors.Is(err, eventlog.ErrConflict) {
		t.Errorf("stale expectation on a moved ledger: %v, want ErrConflict", err)
	}
	// And expecting a sequence the stream still holds on an empty ledger is
	// a conflict too (nothing expired there).
	last := streamState(t, js).LastSeq
	if _, _, err := app.Append(ctx, reserve("macos", "berth-5-1"), ptr(last)); !errors.Is(err, eventlog.ErrConflict) {
		t.Errorf("expecting seq %d on an empty ledger: %v, want ErrConflict", last, err)
	}
}

// Given the log as EnsureStream makes it, when more consumers than the
// server's default of 1,000 per stream are created (two per host: 500
// hosts and the services), then every one is accepted; and a log made
// before this setting (the server's default) gets it on the next start.
func TestTheLogTakesMoreConsumersThanTheServersDefault(t *testing.T) {
	js, _ := startWith(t, eventlog.StreamConfig{})
	ctx := ctxFor(t)
	s, err := js.Stream(ctx, events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1010 {
		if _, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: fmt.Sprintf("c-%d", i), AckPolicy: jetstream.AckExplicitPolicy, MemoryStorage: true}); err != nil {
			t.Fatalf("consumer %d: %v", i+1, err)
		}
	}
	cfg := s.CachedInfo().Config
	cfg.MaxConsumers = -1 // as a stream made by an older build is
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := eventlog.EnsureStream(ctx, js, eventlog.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.MaxConsumers != eventlog.MaxConsumers {
		t.Errorf("max consumers %d after EnsureStream, want %d", info.Config.MaxConsumers, eventlog.MaxConsumers)
	}
}
