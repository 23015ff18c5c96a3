package events_test

import (
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/berth-ci/berth/events"
)

// Law 11 in the fold: only a job's own fault spends its attempts, a
// release written before culprits existed reads as its reason's culprit,
// and a host's health record folds the same in any order.
func TestCulpritOnlyTheJobsOwnFaultCountsAgainstItsAttempts(t *testing.T) {
	var s script
	s.add(&events.JobQueued{JobRef: events.JobRef{JobID: 1, Labels: []string{"linux"}}})
	for n, r := range []struct{ reason, culprit string }{
		{events.ReleaseCreateFailed, events.CulpritHost},
		{events.ReleaseRegistration, ""},     // legacy: image
		{events.ReleaseProvisionTimeout, ""}, // legacy: host
		{events.ReleaseGitHubRefused, events.CulpritGitHub},
		{events.ReleaseRateLimited, ""},
		{events.ReleaseMintFailed, ""}, // legacy: the job's
		{events.ReleaseCreateFailed, events.CulpritJob},
	} {
		a := events.AttemptID(1, n+1)
		s.add(&events.SlotReserved{Pool: "linux", Host: "h-a", Attempt: a, JobID: 1, N: n + 1})
		s.add(&events.SlotReleased{Pool: "linux", Host: "h-a", Attempt: a, JobID: 1, Reason: r.reason, Culprit: r.culprit})
	}
	f := given(s.evs...)
	if got := f.Jobs[1].FailedAttempts; got != 2 {
		t.Fatalf("%d failed attempts, want 2 (the legacy mint_failed and the one charged to the job)", got)
	}
	h := f.Hosts["h-a"].Health
	if n, culprit, _ := h.Streak(t0); n != 2 || culprit != events.CulpritHost {
		t.Fatalf("streak %d %s, want the 2 host failures (create, provision) beside 1 image failure", n, culprit)
	}
	if !f.GitHub.Refusing() {
		t.Fatal("the fold does not show GitHub refusing")
	}
}

func TestCulpritHostHealthFoldsTheSameInAnyOrder(t *testing.T) {
	var s script
	s.add(&events.HostOnline{Host: "h-a", Boot: "b", PhysicalCap: 4, Pools: map[string]events.PoolSlots{"linux": {Slots: 4}}})
	for n := 1; n <= 20; n++ {
		a := events.AttemptID(int64(n), 1)
		ref := events.AttemptRef{Attempt: a, Pool: "linux", Host: "h-a"}
		s.add(&events.SlotReserved{Pool: "linux", Host: "h-a", Attempt: a, JobID: int64(n), N: 1})
		switch n % 4 {
		case 0:
			s.add(&events.AttemptRunnerStarted{AttemptRef: ref})
			s.add(&events.SlotReleased{Pool: "linux", Host: "h-a", Attempt: a, JobID: int64(n), Reason: events.ReleaseCompleted})
		default:
			s.add(&events.SlotReleased{Pool: "linux", Host: "h-a", Attempt: a, JobID: int64(n), Reason: events.ReleaseCreateFailed,
				Culprit: events.CulpritHost})
		}
		if n == 10 {
			s.add(&events.HostDegraded{HostChange: events.HostChange{Host: "h-a", Reason: "r"}, Culprit: events.CulpritHost, Failures: 3})
		}
		if n == 15 {
			s.add(&events.HostRecovered{HostChange: events.HostChange{Host: "h-a", Reason: "ok"}})
		}
	}
	want := given(s.evs...).Hosts["h-a"].Health
	if len(want.Failures) != events.FailureMemory && len(want.Failures) != 15 {
		t.Fatalf("%d failures kept", len(want.Failures))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 50; i++ {
		evs := append([]events.Event(nil), s.evs...)
		rng.Shuffle(len(evs), func(a, b int) { evs[a], evs[b] = evs[b], evs[a] })
		evs = append(evs, evs[:5]...) // and duplicates
		if got := given(evs...).Hosts["h-a"].Health; !reflect.DeepEqual(got, want) {
			t.Fatalf("order %d folds differently:\n got %+v\nwant %+v", i, got, want)
		}
	}
}

// Found by a new user: with the dispatcher's sealing key not trusted, each
// placement's agent refuses to open it (culprit berth) and the dispatcher
// booked again at once: two jobs took 2,000 attempts (and as many runner
// registrations) in a minute, with no alarm. A failure charged to Berth on
// a host now counts toward the host's degradation like a host's own, with
// Berth as the culprit, so placements back off it and the alarm says why;
// it still spends none of the job's attempts.
func TestCulpritPlacementsAnAgentCannotOpenDegradeTheHostAsBerths(t *testing.T) {
	var s script
	s.add(&events.JobQueued{JobRef: events.JobRef{JobID: 1, Labels: []string{"linux"}}})
	for n := 1; n <= 3; n++ {
		a := events.AttemptID(1, n)
		s.add(&events.SlotReserved{Pool: "linux", Host: "h-a", Attempt: a, JobID: 1, N: n})
		s.add(&events.SlotReleased{Pool: "linux", Host: "h-a", Attempt: a, JobID: 1, Reason: events.ReleaseCreateFailed,
			Culprit: events.CulpritBerth})
	}
	f := given(s.evs...)
	if got := f.Jobs[1].FailedAttempts; got != 0 {
		t.Errorf("%d attempts spent, want none (the fault is Berth's)", got)
	}
	if n, culprit, _ := f.Hosts["h-a"].Health.Streak(t0); n != 3 || culprit != events.CulpritBerth {
		t.Errorf("streak %d %s, want 3 charged to berth", n, culprit)
	}
	if got := events.AlarmCulprit(events.AlarmHostDegraded); got != events.CulpritHost {
		t.Errorf("a degraded host's alarm charges %q", got)
	}
}
