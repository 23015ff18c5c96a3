package eventlog_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/clock"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// foldAdmitted folds the whole log through a fresh shell, so facts their
// subjects do not confirm are refused as every service refuses them.
func foldAdmitted(t *testing.T, js jetstream.JetStream, clk clock.Clock) (*events.Fleet, []events.Event) {
	t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	reader := eventlog.NewShell(nil, nil, clk, nil)
	var all []events.Event
	for seq := uint64(1); seq <= stored(t, js); seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		ev, derr := events.Unmarshal(m.Data, seq)
		ev.Seq, ev.Subject = seq, m.Subject
		reader.Apply(eventlog.Delivered{Event: ev, Err: derr})
		all = append(all, ev)
	}
	return reader.Fold, all
}

// Issue 17 (stored means read back) and issue 16 (nobody squats another's
// ids): given a slot held by berth-1-1 and another fact already stored
// under the id its release will use ("berth-1-1/released"), when the shell
// appends the release: a fact stored under that id on another subject (a
// forgery, another type) takes nothing, since the server deduplicates by
// the id scoped to its subject (eventlog.MsgID), so the release is stored
// as it is; on the same subject, the server answers "duplicate", the shell
// reads the stored fact back, and when it is not this release (another
// attempt's), the mismatch is counted and the release is stored at once
// under a fresh id (berth-1-1/released#<seq>), so the slot goes back now,
// not after the duplicate window; when it is the shell's own (a retried
// publish), nothing more is appended. Every case releases the slot once.
func TestADuplicateAnswerIsReadBackAndATakenIdIsAppendedAgainUnderAFreshOne(t *testing.T) {
	const attempt = "berth-1-1"
	ours := events.SlotReleased{Pool: "linux", Host: "h", Attempt: attempt, Reason: events.ReleaseCompleted, JobID: 1}
	cases := []struct {
		name      string
		taker     func(at eventlog.Appender) events.Event // stored under ours' id before the shell appends
		mismatch  bool                                    // the server answers duplicate and the stored fact is another
		wantFacts int                                     // releases of berth-1-1 in the log, the taker's included
	}{
		{"a forged release on a subject that does not confirm it", func(at eventlog.Appender) events.Event {
			e := events.NewBy("berth/vmagent/h", events.RoleAgent, clock.Real.Now(),
				events.SlotReleased{Pool: "linux", Host: "h", Attempt: attempt, Reason: events.ReleaseOperator})
			e.Subject = "berth.evt.pool.linux.agent"
			return e
		}, false, 2},
		{"another attempt's release", func(at eventlog.Appender) events.Event {
			e := at.New(clock.Real.Now(), events.SlotReleased{Pool: "linux", Host: "h", Attempt: "berth-9-1", Reason: events.ReleaseSurplus})
			e.ID = ours.EventID()
			return e
		}, true, 1},
		{"another type of fact", func(at eventlog.Appender) events.Event {
			e := at.New(clock.Real.Now(), events.JobQueued{JobRef: events.JobRef{JobID: 5, Labels: []string{"x"}}})
			e.ID = ours.EventID()
			return e
		}, false, 1},
		{"the shell's own release (a retried publish)", func(at eventlog.Appender) events.Event {
			return at.New(clock.Real.Now(), ours)
		}, false, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, js, fake := shellOn(t)
			ctx := context.Background()
			s.Log.Role = events.RoleDispatcher
			if err := s.Append(ctx, events.SlotReserved{Pool: "linux", Host: "h", Attempt: attempt, JobID: 1, N: 1}); err != nil {
				t.Fatal(err)
			}
			other := eventlog.Appender{JS: js, Source: "another-writer"}
			taker := c.taker(other)
			if _, _, err := other.Append(ctx, taker, nil); err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(taker.Subject, events.PoolSubject("linux")) {
				s.Fold.Pools["linux"].LastSeq = stored(t, js) // the shell has read the ledger up to here
			}

			s.Execute(ctx, events.Plan{events.Fact(ours)}, nil)

			fold, log := foldAdmitted(t, js, fake)
			a := fold.Attempts[attempt]
			if a == nil || a.Held() || a.Releases() != 1 {
				t.Fatalf("attempt %+v (releases %d), want released exactly once", a, a.Releases())
			}
			if held := fold.Pools["linux"].Held; held != 0 {
				t.Fatalf("linux holds %d slots, want 0", held)
			}
			var releases []string
			for _, e := range log {
				if r, ok := e.Data.(*events.SlotReleased); ok && r.Attempt == attempt {
					releases = append(releases, e.ID)
				}
			}
			if len(releases) != c.wantFacts {
				t.Fatalf("releases of %s in the log: %v, want %d", attempt, releases, c.wantFacts)
			}
			fresh := false
			for _, e := range log {
				fresh = fresh || strings.HasPrefix(e.ID, ours.EventID()+"#")
			}
			if want := uint64(0); c.mismatch {
				want = 1
				if !fresh {
					t.Fatalf("no release under a fresh id in %v", log)
				}
				if s.MismatchedTotal() != want {
					t.Fatalf("mismatches %d, want %d", s.MismatchedTotal(), want)
				}
			} else if fresh || s.MismatchedTotal() != 0 {
				t.Fatalf("no duplicate, or one that stands, was appended again (fresh %v) or counted (%d)", fresh, s.MismatchedTotal())
			}
			// A retry of the same step (the next round, a crash before the
			// fold saw it) stores nothing more: the fresh id is the same.
			s.Forget(ours.EventID())
			before := stored(t, js)
			s.Execute(ctx, events.Plan{events.Fact(ours)}, nil)
			if after := stored(t, js); after != before {
				t.Fatalf("the retried release stored %d more facts, want none", after-before)
			}
		})
	}
}

// Given an id holding another fact, JudgeDuplicate says what differs, and a
// fact the fold would not apply as ours (refused where it stands) is taken.
func TestJudgeDuplicate(t *testing.T) {
	ours := events.NewBy("berth/dispatcher", events.RoleDispatcher, clock.Real.Now(),
		events.SlotReleased{Pool: "linux", Host: "h", Attempt: "berth-1-1", Reason: events.ReleaseCompleted})
	same := ours
	same.Time, same.Source = same.Time.Add(1), "a retry"
	if v, d := eventlog.JudgeDuplicate(ours, same, nil); v != eventlog.DupSame || d != "" {
		t.Fatalf("a retried publish judged %v (%s)", v, d)
	}
	forged := ours
	forged.Subject = "berth.evt.pool.linux.agent"
	v, d := eventlog.JudgeDuplicate(ours, forged, nil)
	if v != eventlog.DupTaken || !strings.Contains(d, "subject berth.evt.pool.linux.agent") {
		t.Fatalf("a forged fact judged %v (%s)", v, d)
	}
	if v, _ := eventlog.JudgeDuplicate(ours, events.Event{Seq: 3}, events.ErrMalformed); v != eventlog.DupTaken {
		t.Fatalf("unreadable bytes judged %v", v)
	}
}

// Issue 16, found by an attack with an agent's key: JetStream deduplicates
// Nats-Msg-Id across the whole stream, so any writer can publish on its
// own subject with the header set to the id a dispatcher's release will
// use (MsgID: subject|id, both predictable), and to every retake it can
// predict. Given the release's id and the retakes id#<seq> of each decoy's
// own seq taken that way, when the shell appends the release, then it is
// stored in one retake under an id nobody could predict, the slot is
// released once, and the mismatch is counted.
func TestAReleaseWhoseIdsAnotherWriterTookIsStoredAtOnce(t *testing.T) {
	const attempt = "berth-1-1"
	s, js, _ := shellOn(t)
	ctx := context.Background()
	s.Log.Role = events.RoleDispatcher
	if err := s.Append(ctx, events.SlotReserved{Pool: "linux", Host: "h", Attempt: attempt, JobID: 1, N: 1}); err != nil {
		t.Fatal(err)
	}
	ours := events.NewBy("test", events.RoleDispatcher, clock.Real.Now(),
		events.SlotReleased{Pool: "linux", Host: "h", Attempt: attempt, Reason: events.ReleaseCompleted, JobID: 1})
	ours.Subject = events.SubjectBy(ours.Data, events.RoleDispatcher)
	// The decoys: an agent's harmless fact on its own subject, under our ids.
	decoy := events.NewBy("berth/vmagent/h", events.RoleAgent, clock.Real.Now(),
		events.HostDraining{HostChange: events.HostChange{Host: "h"}})
	decoy.Subject = events.SubjectBy(decoy.Data, events.RoleAgent)
	body, err := events.Marshal(decoy)
	if err != nil {
		t.Fatal(err)
	}
	id := eventlog.MsgID(ours)
	for i := 0; i < 4; i++ {
		ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: decoy.Subject, Data: body, Header: nats.Header{"Nats-Msg-Id": []string{id}}})
		if err != nil {
			t.Fatal(err)
		}
		id = eventlog.MsgID(ours) + "#" + strconv.FormatUint(ack.Sequence, 10) // the retake an attacker could predict
	}
	s.Execute(ctx, events.Plan{events.Fact(ours.Data)}, nil)
	fold, log := foldAdmitted(t, js, nil)
	if a := fold.Attempts[attempt]; a == nil || a.Held() || a.Releases() != 1 {
		t.Fatalf("attempt %+v, want released exactly once", a)
	}
	if s.MismatchedTotal() != 1 {
		t.Errorf("mismatches %d, want 1", s.MismatchedTotal())
	}
	for _, e := range log {
		if r, ok := e.Data.(*events.SlotReleased); ok && r.Attempt == attempt && !strings.HasPrefix(e.ID, ours.ID+"#") {
			t.Errorf("the release was stored under %s, not a retaken id", e.ID)
		}
	}
}

// The same for an agent, which may not read the log by sequence (only its
// own subjects): given another writer holding the id of the agent's next
// fact on a subject the agent cannot read, when the agent appends it, then
// the duplicate answer is not taken for its own (the stored fact is not the
// last on its subject) and the fact is stored under a fresh id; a retried
// publish of a fact it did store still stores nothing more.
func TestAnAgentsFactWhoseIdIsTakenElsewhereIsStored(t *testing.T) {
	s, js, _ := shellOn(t)
	ctx := context.Background()
	s.Log.Role, s.Log.NoReadBack = events.RoleAgent, true
	ref := events.AttemptRef{Attempt: "berth-2-1", Pool: "linux", Host: "host-b"}
	ours := events.NewBy("test", events.RoleAgent, clock.Real.Now(), &events.AttemptStopped{AttemptRef: ref})
	ours.Subject = events.SubjectBy(ours.Data, events.RoleAgent)
	decoy := events.NewBy("berth/vmagent/host-a", events.RoleAgent, clock.Real.Now(),
		&events.HostDraining{HostChange: events.HostChange{Host: "host-a"}})
	decoy.Subject = events.SubjectBy(decoy.Data, events.RoleAgent)
	body, err := events.Marshal(decoy)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: decoy.Subject, Data: body,
		Header: nats.Header{"Nats-Msg-Id": []string{eventlog.MsgID(ours)}}}); err != nil {
		t.Fatal(err)
	}
	before := stored(t, js)
	if err := s.Append(ctx, ours.Data); err != nil {
		t.Fatal(err)
	}
	if after := stored(t, js); after != before+1 {
		t.Fatalf("the agent's stop stored %d facts, want 1 under a fresh id", after-before)
	}
	if s.MismatchedTotal() != 1 {
		t.Errorf("mismatches %d, want 1", s.MismatchedTotal())
	}
	s.Forget(ours.Data.EventID())
	if err := s.Append(ctx, ours.Data); err != nil {
		t.Fatal(err)
	}
	if after := stored(t, js); after != before+1 {
		t.Errorf("a retried stop stored %d more facts, want none", after-before-1)
	}
}
