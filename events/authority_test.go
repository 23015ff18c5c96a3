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
