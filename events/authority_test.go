package events_test

import (
	"errors"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
)

// Every fact type in the catalogue names who may write it.
func TestEveryFactTypeNamesItsAuthors(t *testing.T) {
	for typ := range events.Types() {
		if len(events.Authors(typ)) == 0 {
			t.Errorf("%s has no author in the catalogue", typ)
		}
	}
}

// The findings of issue 16, as a reader sees them: each forged fact is
// refused from its stored subject alone, whatever its payload claims.
func TestAuthorizeRefusesWhatTheSubjectDoesNotConfirm(t *testing.T) {
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	onAgentA := func(p events.Payload, subject string) events.Event {
		e := events.NewBy("berth/vmagent/host-a", events.RoleAgent, at, p)
		e.Subject = subject
		return e
	}
	ref := events.AttemptRef{Attempt: "berth-7-1", Pool: "linux", Host: "host-a"}
	for _, tc := range []struct {
		name string
		e    events.Event
		ok   bool
	}{
		{"an agent's own host fact", events.NewBy("a", events.RoleAgent, at, events.HostOnline{Host: "host-a"}), true},
		{"an agent's runner started on its own host", events.NewBy("a", events.RoleAgent, at, events.AttemptRunnerStarted{AttemptRef: ref}), true},
		{"a watchdog's release", events.NewBy("w", events.RoleWatchdog, at, events.SlotReleased{Pool: "linux", Attempt: "berth-7-1"}), true},
		{"a job fact on its job's subject", events.NewBy("d", events.RoleDispatcher, at, events.JobQueued{JobRef: events.JobRef{JobID: 7}}), true},
		{"host-a announcing host-b with its own key",
			onAgentA(events.HostOnline{Host: "host-b", CurveKey: "XA"}, "berth.evt.host.host-a.agent"), false},
		{"an agent releasing a slot",
			onAgentA(events.SlotReleased{Pool: "linux", Attempt: "berth-7-1"}, "berth.evt.pool.linux.agent"), false},
		{"an agent completing a job (on any subject it can write)",
			onAgentA(events.JobCompleted{JobRef: events.JobRef{JobID: 7}}, "berth.evt.host.host-a.agent"), false},
		{"an agent placing an attempt on its own host",
			onAgentA(events.AttemptPlaced{AttemptRef: ref}, "berth.evt.attempt.host-a.berth-7-1.agent"), false},
		{"a watchdog placing an attempt",
			events.NewBy("w", events.RoleWatchdog, at, events.AttemptPlaced{AttemptRef: ref}), false},
		{"a fact with no author token", events.Event{ID: "x", Subject: "berth.evt.pool.linux", Data: events.SlotReleased{Pool: "linux"}}, false},
		{"a role token that is no role", events.Event{ID: "x", Subject: "berth.evt.pool.linux.root", Data: events.SlotReleased{Pool: "linux"}}, false},
		{"a job fact on another job's subject", events.Event{ID: "x", Subject: "berth.evt.job.8", Data: events.JobCompleted{JobRef: events.JobRef{JobID: 7}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := events.Authorize(tc.e)
			if tc.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !tc.ok && !errors.Is(err, events.ErrForged) {
				t.Fatalf("accepted (err %v)", err)
			}
		})
	}
}

// A pool's ledger spans one subject per author; an optimistic-concurrency
// check covers them all.
func TestAggregateFilterCoversEveryAuthor(t *testing.T) {
	for subject, want := range map[string]string{
		"berth.evt.pool.linux.watchdog":            "berth.evt.pool.linux.*",
		"berth.evt.attempt.h.berth-1-1.dispatcher": "berth.evt.attempt.h.berth-1-1.*",
		"berth.evt.job.7":                          "berth.evt.job.7",
	} {
		if got := events.AggregateFilter(subject); got != want {
			t.Errorf("AggregateFilter(%s) = %s, want %s", subject, got, want)
		}
	}
}

// Issue 16, found by an attack with host-a's key: the subject of an attempt
// fact confirms a host and an attempt id, and Authorize checks no more; the
// fold keys attempts by id. Given berth-7-1 booked and placed on host-b,
// when host-a's agent writes, on its own subject, berth-7-1 failed or
// stopped (naming itself as the host), then Admit refuses it; host-b's own
// agent's fact is admitted; and an agent's fact about an attempt no
// booking names (a future id taken first) is refused, while the
// dispatcher's booking of a new attempt is admitted.
func TestAdmitRefusesAFactOnAnotherHostsAttempt(t *testing.T) {
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	f := events.NewFleet()
	onB := events.AttemptRef{Attempt: "berth-7-1", Pool: "linux", Host: "host-b"}
	seq := uint64(0)
	apply := func(role events.Role, p events.Payload) {
		seq++
		e := events.NewBy("test", role, at, p)
		e.Seq, e.Subject = seq, events.SubjectBy(p, role)
		if _, err := events.Admit(f, e); err != nil {
			t.Fatalf("setting up: %v", err)
		}
		f.Apply(e)
	}
	apply(events.RoleDispatcher, &events.SlotReserved{Pool: "linux", Host: "host-b", Attempt: "berth-7-1", JobID: 7, N: 1})
	apply(events.RoleDispatcher, &events.AttemptPlaced{AttemptRef: onB, JobID: 7})

	admit := func(role events.Role, p events.Payload) error {
		e := events.NewBy("test", role, at, p)
		e.Seq, e.Subject = seq+1, events.SubjectBy(p, role)
		_, err := events.Admit(f, e)
		return err
	}
	asA := events.AttemptRef{Attempt: "berth-7-1", Pool: "linux", Host: "host-a"}
	for name, p := range map[string]events.Payload{
		"host-b's attempt failed, said by host-a":  &events.AttemptFailed{AttemptRef: asA, Step: "drain", Culprit: "job"},
		"host-b's attempt stopped, said by host-a": &events.AttemptStopped{AttemptRef: asA},
		"a future attempt id, claimed by host-a": &events.AttemptFailed{AttemptRef: events.AttemptRef{Attempt: "berth-8-1",
			Pool: "linux", Host: "host-a"}, Step: "create"},
	} {
		if err := admit(events.RoleAgent, p); !errors.Is(err, events.ErrForged) {
			t.Errorf("%s: %v, want refused as forged", name, err)
		}
	}
	if err := admit(events.RoleAgent, &events.AttemptStopped{AttemptRef: onB}); err != nil {
		t.Errorf("host-b's own stop of its attempt: %v", err)
	}
	if err := admit(events.RoleDispatcher, &events.AttemptPlaced{AttemptRef: events.AttemptRef{Attempt: "berth-8-1", Pool: "linux", Host: "host-a"}, JobID: 8}); err != nil {
		t.Errorf("the dispatcher placing a new attempt: %v", err)
	}
}
