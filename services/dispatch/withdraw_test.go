package dispatch_test

import (
	"testing"

	"github.com/berth-ci/berth/events"
)

// Given a job booked on a host that is then cordoned before the booking got
// a VM (BL-32: a decision made before the cordon is stale after it), when
// the dispatcher decides, then the booking goes back with reason
// host_cordoned, the job is booked on another host, and the job's failed
// attempts do not grow: a cordon never spends them.
func TestCordonTakesBackABookingWithoutAVM(t *testing.T) {
	l := given(t).add(host("h-a", 2, 2), queued(1))
	l.apply(l.decide())
	a := l.f.Attempts[events.AttemptID(1, 1)]
	if a == nil || a.Host != "h-a" || a.Placed {
		t.Fatalf("want an unplaced booking on h-a, got %+v", a)
	}
	l.add(&events.HostCordoned{HostChange: events.HostChange{Host: "h-a", Reason: "maintenance", By: "ops", At: t0}},
		host("h-b", 2, 2))
	plan := l.decide()
	if len(plan.Release) != 1 || plan.Release[0].Reason != events.ReleaseHostCordoned {
		t.Fatalf("release %+v, want one host_cordoned", plan.Release)
	}
	for _, m := range plan.Mint {
		if m.ID == a.ID {
			t.Fatal("minting for a booking that the cordon took back")
		}
	}
	l.apply(plan)
	l.apply(l.decide())
	if b := l.f.Attempts[events.AttemptID(1, 2)]; b == nil || b.Host != "h-b" || !b.Held() {
		t.Fatalf("job not booked again on h-b: %+v", b)
	}
	if n := l.f.Jobs[1].FailedAttempts; n != 0 {
		t.Errorf("cordon spent %d of the job's attempts", n)
	}
}

// Given a draining host with an idle runner (started, no job) and a busy one,
// when the dispatcher decides, then the idle runner's slot goes back
// (GitHub would hand it a new job otherwise) and the busy one is left to
// finish its job.
func TestDrainReleasesIdleRunnersAndLeavesBusyOnes(t *testing.T) {
	l := given(t).add(host("h-a", 2, 2), queued(1), queued(2))
	l.apply(l.decide())
	idle, busy := events.AttemptID(1, 1), events.AttemptID(2, 1)
	for _, id := range []string{idle, busy} {
		r := events.AttemptRef{Attempt: id, Pool: "linux", Host: "h-a"}
		l.add(&events.AttemptPlaced{AttemptRef: r, JobID: 1}, &events.AttemptProvisioning{AttemptRef: r},
			&events.AttemptRunnerStarted{AttemptRef: r})
	}
	l.add(inProgress(2, busy), &events.HostDraining{HostChange: events.HostChange{Host: "h-a", Reason: "SIGTERM", At: t0}})
	plan := l.decide()
	got := map[string]string{}
	for _, r := range plan.Release {
		got[r.Attempt] = r.Reason
	}
	if got[idle] != events.ReleaseHostDraining || len(got) != 1 {
		t.Fatalf("releases %v, want only %s with host_draining", got, idle)
	}
}

// Given a placement an agent refused because its host drains, the slot goes
// back as host_draining and the job's attempts are not spent.
func TestAPlacementRefusedByADrainDoesNotSpendAnAttempt(t *testing.T) {
	l := given(t).add(host("h-a", 2, 2), queued(1))
	l.apply(l.decide())
	r := events.AttemptRef{Attempt: events.AttemptID(1, 1), Pool: "linux", Host: "h-a"}
	l.add(&events.AttemptPlaced{AttemptRef: r, JobID: 1},
		&events.AttemptFailed{AttemptRef: r, Step: events.StepDrain, Error: "host draining"})
	plan := l.decide()
	if len(plan.Release) != 1 || plan.Release[0].Reason != events.ReleaseHostDraining {
		t.Fatalf("release %+v", plan.Release)
	}
	l.apply(plan)
	if n := l.f.Jobs[1].FailedAttempts; n != 0 {
		t.Errorf("a drain spent %d attempts", n)
	}
}

// A runner that already took a job keeps its slot whatever its create step
// reported afterwards (failed, or overran its deadline): releasing it would
// tear down a VM that is running a job.
func TestABoundAttemptIsNotReleasedForACreateFailure(t *testing.T) {
	l := given(t).add(host("h-a", 2, 2), queued(7))
	l.apply(l.decide())
	r := events.AttemptRef{Attempt: events.AttemptID(7, 1), Pool: "linux", Host: "h-a"}
	l.add(&events.AttemptPlaced{AttemptRef: r, JobID: 7}, &events.AttemptProvisioning{AttemptRef: r},
		inProgress(7, r.Attempt), &events.AttemptFailed{AttemptRef: r, Step: "create", Error: "WaitDelay expired"})
	if plan := l.decide(); len(plan.Release) != 0 {
		t.Fatalf("released a bound attempt: %+v", plan.Release)
	}
}
