package eventlog_test

import (
	"context"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/clock"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/nats-io/nats.go/jetstream"
)

type mint string

func (m mint) CallKey() string { return string(m) }

// shellOn is a shell over a fresh log, with a fake clock.
func shellOn(t testing.TB) (*eventlog.Shell, jetstream.JetStream, *clock.Fake) {
	t.Helper()
	_, js, _ := testkit.NATS(t)
	testkit.Stream(t, js, eventlog.StreamConfig{})
	fake := clock.NewFake(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	s := eventlog.NewShell(&eventlog.Loop{JS: js}, &eventlog.Appender{JS: js, Source: "test"}, fake, nil)
	return s, js, fake
}

func stored(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	last, err := eventlog.LastSeq(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	return last
}

// Given a plan that books on a ledger the shell's fold is behind on, when
// it is executed, then the booking conflicts, the ledger's later steps
// (and the mint behind the booking) wait for the next round, and another
// pool's ledger goes on.
func TestAConflictedLedgerWaitsForTheNextRoundOthersGoOn(t *testing.T) {
	s, js, _ := shellOn(t)
	ctx := context.Background()
	other := &eventlog.Appender{JS: js, Source: "another-writer"}
	if _, _, err := other.Append(ctx, other.New(time.Now(), events.SlotReserved{Pool: "linux", Host: "h", Attempt: "berth-9-1", JobID: 9, N: 1}), nil); err != nil {
		t.Fatal(err)
	}
	var calls []string
	var plan events.Plan
	plan.Add(
		events.Step{Fact: events.SlotReserved{Pool: "linux", Host: "h", Attempt: "berth-1-1", JobID: 1, N: 1},
			Then: []events.Step{events.Do(mint("mint berth-1-1"))}},
		events.Fact(events.SlotReserved{Pool: "linux", Host: "h", Attempt: "berth-2-1", JobID: 2, N: 1}),
		events.Step{Fact: events.SlotReserved{Pool: "macos", Host: "h", Attempt: "berth-3-1", JobID: 3, N: 1},
			Then: []events.Step{events.Do(mint("mint berth-3-1"))}},
	)
	s.Execute(ctx, plan, func(_ context.Context, c events.Call) { calls = append(calls, c.CallKey()) })
	if len(calls) != 1 || calls[0] != "mint berth-3-1" {
		t.Fatalf("calls %v, want only the macos booking's mint", calls)
	}
	if got := stored(t, js); got != 2 {
		t.Fatalf("%d facts in the log, want the other writer's and the macos booking", got)
	}
	// The shell folded its own ledger fact: the next booking on macos
	// chains onto it without waiting for the consumer.
	if l := s.Fold.Pools["macos"]; l == nil || l.LastSeq != 2 {
		t.Fatalf("macos ledger at %+v, want seq 2 folded by the shell", l)
	}
}

// Given a fact the shell appended, when the same plan is executed again
// before the fact comes back through the log, then nothing is appended
// twice; once it is folded, or once InFlightFor passes on the clock, the
// mark is gone and a lost append would be decided again.
func TestAnAppendedFactIsNotAppendedAgainWhileInFlight(t *testing.T) {
	s, js, fake := shellOn(t)
	ctx := context.Background()
	lost := events.HostLost{HostChange: events.HostChange{Host: "h", At: fake.Now(), Reason: "silent"}}
	plan := events.Plan{{Fact: lost, Key: "lost/h"}}
	s.Execute(ctx, plan, nil)
	later := lost
	later.At = fake.Now().Add(time.Second) // another id, the same condition
	s.Execute(ctx, events.Plan{{Fact: later, Key: "lost/h"}}, nil)
	if got := stored(t, js); got != 1 {
		t.Fatalf("%d facts, want 1: the condition's key keeps it from repeating", got)
	}
	if !s.InFlight("lost/h") {
		t.Fatal("the condition is not in flight after its append")
	}
	fake.Advance(eventlog.DefaultInFlightFor)
	s.Housekeep()
	if s.InFlight("lost/h") {
		t.Fatal("an in-flight mark outlived InFlightFor: a lost append would never be decided again")
	}
	// Folding the fact back also clears its mark.
	s.Execute(ctx, events.Plan{{Fact: later, Key: "lost/h"}}, nil)
	ev := s.Log.New(fake.Now(), later)
	ev.Seq = 2
	s.Apply(eventlog.Delivered{Event: ev})
	if s.InFlight("lost/h") {
		t.Fatal("a fact folded back is still in flight")
	}
}

// Given a slot held for a running attempt, when a fact its subject does not
// confirm arrives (an agent's credential writing a release on its own
// subject), then the shell refuses it: never folded, counted, told to the
// Refused hook and parked with the reason (law 10; issue 16).
func TestAForgedFactIsRefusedParkedAndNeverFolded(t *testing.T) {
	s, js, fake := shellOn(t)
	var told []string
	s.Refused = func(e events.Event, err error) { told = append(told, e.Subject) }
	ref := events.AttemptRef{Attempt: "berth-7-1", Pool: "linux", Host: "host-a"}
	history := []events.Payload{
		&events.HostOnline{Host: "host-a", PhysicalCap: 2, CurveKey: "X", Pools: map[string]events.PoolSlots{"linux": {Slots: 1}}},
		&events.SlotReserved{Pool: "linux", Host: "host-a", Attempt: ref.Attempt, JobID: 7, N: 1},
		&events.AttemptPlaced{AttemptRef: ref, JobID: 7, RunnerID: 1},
	}
	for i, p := range history {
		e := events.New("test", fake.Now(), p)
		e.Seq = uint64(i + 1)
		s.Apply(eventlog.Delivered{Event: e})
	}
	forged := events.NewBy("berth/vmagent/host-a", events.RoleAgent, fake.Now(),
		&events.SlotReleased{Pool: "linux", Host: "host-a", Attempt: ref.Attempt, Reason: "completed"})
	forged.Subject, forged.Seq = "berth.evt.pool.linux.agent", 4
	s.Apply(eventlog.Delivered{Event: forged})
	if a := s.Fold.Attempts[ref.Attempt]; a == nil || !a.Held() {
		t.Fatalf("a forged release was folded: %+v", a)
	}
	if s.RefusedTotal() != 1 || len(told) != 1 {
		t.Fatalf("refused %d, told %v; want 1 each", s.RefusedTotal(), told)
	}
	if l := s.Fold.Pools["linux"]; l == nil || l.LastSeq != 4 {
		t.Fatalf("the ledger's sequence did not move past the refused fact: %+v (every later booking would conflict)", l)
	}
	testkit.EventuallyErr(t, 10*time.Second, "a parking record for the refused fact", func() error {
		kv, err := js.KeyValue(context.Background(), events.BucketParked)
		if err != nil {
			return err
		}
		_, err = kv.Get(context.Background(), events.ParkedKey("reader", 4))
		return err
	})
}

// Given bytes that are no Berth envelope stored on a subject a credential
// may write, when the shell reads them, then they are refused like a forged
// fact (counted, told to the Refused hook, parked) rather than skipped in
// silence: junk on one's own subject is how a misused credential probes.
// An unknown type (a newer version) is still only skipped.
func TestMalformedBytesAreRefusedUnknownTypesSkipped(t *testing.T) {
	s, _, _ := shellOn(t)
	var told int
	s.Refused = func(events.Event, error) { told++ }
	_, malformed := events.Unmarshal([]byte("owned-by-agent-host-a"), 1)
	s.Apply(eventlog.Delivered{Event: events.Event{Seq: 1, Subject: "berth.evt.host.host-a.agent"}, Err: malformed})
	_, unknown := events.Unmarshal([]byte(`{"specversion":"1.0","id":"x","type":"berth.host.online.v9","subject":"s","data":{}}`), 2)
	s.Apply(eventlog.Delivered{Event: events.Event{Seq: 2, Subject: "berth.evt.host.host-a.agent"}, Err: unknown})
	if s.RefusedTotal() != 1 || told != 1 {
		t.Fatalf("refused %d, told %d; want the malformed bytes refused, the unknown type skipped", s.RefusedTotal(), told)
	}
	if s.Fold.LastSeq != 2 || s.Fold.Skipped != 2 {
		t.Fatalf("fold at seq %d with %d skipped, want 2 and 2", s.Fold.LastSeq, s.Fold.Skipped)
	}
}

// Given a shell whose fold drops sealed JIT configs (the dispatcher's),
// when it restores a snapshot of a fold that kept one for a live attempt,
// then the restored fold holds none and goes on dropping them.
func TestARestoredFoldDropsSealedJITAsTheOneItReplaces(t *testing.T) {
	kept := events.NewFleet()
	ref := events.AttemptRef{Attempt: "a-1-1", Pool: "linux", Host: "host-a"}
	kept.Apply(events.Event{Seq: 1, Time: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC),
		Data: &events.AttemptPlaced{AttemptRef: ref, JobID: 1, RunnerID: 10, SealedJIT: []byte("SEALED"), SealedBy: "XD"}})
	b, err := events.MarshalSnapshot(kept)
	if err != nil {
		t.Fatal(err)
	}
	s := eventlog.NewShell(nil, nil, nil, nil)
	s.Fold.DropSealedJIT()
	if _, err := s.RestoreFold(b); err != nil {
		t.Fatal(err)
	}
	a := s.Fold.Attempts[ref.Attempt]
	if s.Fold.KeepsSealedJIT() || a == nil || !a.Placed || a.SealedJIT != nil {
		t.Fatalf("restored fold: keeps sealed configs %v, attempt %+v", s.Fold.KeepsSealedJIT(), a)
	}
	next := events.AttemptRef{Attempt: "a-2-1", Pool: "linux", Host: "host-a"}
	s.Fold.Apply(events.Event{Seq: 2, Time: time.Date(2026, 12, 1, 9, 1, 0, 0, time.UTC),
		Data: &events.AttemptPlaced{AttemptRef: next, JobID: 2, RunnerID: 20, SealedJIT: []byte("SEALED"), SealedBy: "XD"}})
	if b := s.Fold.Attempts[next.Attempt]; b == nil || !b.Placed || b.SealedJIT != nil {
		t.Fatalf("a placement folded after the restore: %+v, want placed without its sealed config", b)
	}
}

// Given a shell whose fold drops delivery ids (the watchdog's), when it
// restores a snapshot of a fold that kept them, then the restored fold
// holds none and goes on dropping them.
func TestARestoredFoldDropsDeliveryIDsAsTheOneItReplaces(t *testing.T) {
	const id = "72d3162e-cc78-11e3-81ab-4c9367dc0958"
	kept := events.NewFleet()
	kept.Apply(events.Event{Seq: 1, Time: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC),
		Data: &events.JobQueued{JobRef: events.JobRef{JobID: 1, Delivery: id, Labels: []string{"linux"}}}})
	b, err := events.MarshalSnapshot(kept)
	if err != nil {
		t.Fatal(err)
	}
	s := eventlog.NewShell(nil, nil, nil, nil)
	s.Fold.DropDeliveryIDs()
	if _, err := s.RestoreFold(b); err != nil {
		t.Fatal(err)
	}
	if s.Fold.KeepsDeliveryIDs() || s.Fold.DeliveryStored(id) || !s.Fold.KnownJob(1) {
		t.Fatalf("restored fold: keeps delivery ids %v, holds %s %v, knows the job %v", s.Fold.KeepsDeliveryIDs(), id, s.Fold.DeliveryStored(id), s.Fold.KnownJob(1))
	}
}
