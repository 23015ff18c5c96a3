package dispatch_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/dispatch"
)

// Issue 17: given a runner that took its job, when the dispatcher decides,
// then it records the binding on the attempt's own subject (the agent's
// fold has no job facts), once: after the fact is folded nothing more.
func TestARunnerThatTookAJobIsRecordedBoundOnItsAttempt(t *testing.T) {
	l := given(t).add(host("h-a", 2, 2)).add(running(7, "h-a")...)
	want := []events.AttemptBound{{AttemptRef: aref(7, 1, "h-a"), JobID: 7}}
	plan := l.decide()
	if !reflect.DeepEqual(plan.Bound, want) {
		t.Fatalf("bound %+v, want %+v", plan.Bound, want)
	}
	l.add(&plan.Bound[0])
	if plan := l.decide(); !reflect.DeepEqual(plan, dispatch.Plan{}) {
		t.Fatalf("after the binding is folded: %+v, want nothing", plan)
	}
}

// Issue 17: given a create abandoned at its deadline whose runner took a
// job anyway, then the slot is held (no release, no teardown) while the job
// runs, and released with the job's completion.
func TestAnAbandonedCreateWhoseRunnerTookAJobKeepsItsSlot(t *testing.T) {
	r := aref(7, 1, "h-a")
	l := given(t).add(host("h-a", 2, 2), queued(7), reserved(7, 1, "h-a"),
		&events.AttemptPlaced{AttemptRef: r, JobID: 7, RunnerID: 70, Labels: linux}, &events.AttemptProvisioning{AttemptRef: r},
		inProgress(7, r.Attempt), &events.AttemptAbandoned{AttemptRef: r, Step: "create"})
	plan := l.decide()
	if len(plan.Release) != 0 || len(plan.Teardown) != 0 || len(plan.Bound) != 1 {
		t.Fatalf("release %+v teardown %+v bound %+v; want the slot held and the binding recorded", plan.Release, plan.Teardown, plan.Bound)
	}
	l.add(&plan.Bound[0], completed(7, r.Attempt, "success"))
	if got := attempts(l.decide().Release); got[r.Attempt] != events.ReleaseCompleted {
		t.Fatalf("after the job completed: releases %v, want %s released as completed", got, r.Attempt)
	}
}

// Issue 17: given a teardown asked before the binding was known (the create
// failed, then the in_progress came), when the job completes, then the
// dispatcher records the job's end on the attempt: no later teardown will
// say it, and the agent keeps the VM until told.
func TestAJobEndIsRecordedForAVMTornDownBeforeItsBinding(t *testing.T) {
	r := aref(7, 1, "h-a")
	l := given(t).add(host("h-a", 2, 2), queued(7), reserved(7, 1, "h-a"),
		&events.AttemptPlaced{AttemptRef: r, JobID: 7, RunnerID: 70, Labels: linux}, &events.AttemptProvisioning{AttemptRef: r},
		&events.AttemptFailed{AttemptRef: r, Step: "create", Error: "exit 1"}, released(7, 1, "h-a", events.ReleaseCreateFailed),
		&events.AttemptTeardownRequested{AttemptRef: r, Reason: events.ReleaseCreateFailed},
		inProgress(7, r.Attempt), &events.AttemptBound{AttemptRef: r, JobID: 7})
	if plan := l.decide(); len(plan.Bound) != 0 {
		t.Fatalf("while the job runs: bound %+v, want nothing", plan.Bound)
	}
	l.add(completed(7, r.Attempt, "success"))
	want := []events.AttemptBound{{AttemptRef: r, JobID: 7, Ended: true}}
	if plan := l.decide(); !reflect.DeepEqual(plan.Bound, want) {
		t.Fatalf("after the job completed: bound %+v, want %+v", plan.Bound, want)
	}
}

// Issue 17: given a runner past its registration deadline that GitHub
// reported busy (422 on deregistration), recorded as a fact, then no
// replica deregisters or releases it for RunnerBusyFor after the answer;
// after that it asks again. It still counts as its pool's supply.
func TestARunnerGitHubCallsBusyIsLeftAloneByEveryReplica(t *testing.T) {
	l := given(t).add(host("h-a", 4, 4), queued(1))
	l.apply(l.decide())
	r := events.AttemptRef{Attempt: attempt(1, 1), Pool: "linux", Host: "h-a"}
	l.add(&events.AttemptPlaced{AttemptRef: r, JobID: 1, RunnerID: 77}, &events.AttemptRunnerStarted{AttemptRef: r})
	p := params
	p.RegistrationTimeout = 10 * time.Minute
	said := l.f.Attempts[r.Attempt].RunnerStartedAt.Add(11 * time.Minute)
	l.add(&events.AttemptRunnerBusy{AttemptRef: r, RunnerID: 77, At: said})

	p.Now = said.Add(30 * time.Second)
	plan := dispatch.Decide(l.f, p)
	if len(plan.Deregister) != 0 || len(plan.Release) != 0 || len(plan.Reserve) != 0 {
		t.Fatalf("GitHub said busy 30s ago: deregister %v release %v reserve %v; want it left alone and its job not booked twice",
			plan.Deregister, plan.Release, plan.Reserve)
	}
	l.add(completed(1, "", "cancelled")) // its job gone: the runner is surplus
	if plan := dispatch.Decide(l.f, p); len(plan.Deregister) != 0 || len(plan.Release) != 0 {
		t.Fatalf("busy and surplus: deregister %v release %v; want it left alone", plan.Deregister, plan.Release)
	}
	p.Now = said.Add(events.RunnerBusyFor + time.Second)
	if plan := dispatch.Decide(l.f, p); len(plan.Deregister) != 1 {
		t.Fatalf("busy answer %v old: deregister %v; want it asked again", events.RunnerBusyFor, plan.Deregister)
	}
}

// Issue 17: given a job GitHub reports in progress on two runners, then the
// conflict is recorded (from state, each round until folded), neither
// runner is released or torn down while the job runs, both are bound to
// it, and both are released when it completes.
func TestAJobInProgressOnTwoRunnersKeepsBoth(t *testing.T) {
	l := given(t).add(host("h-a", 4, 4), queued(1), queued(2))
	l.apply(l.decide())
	for _, job := range []int64{1, 2} {
		r := aref(job, 1, "h-a")
		l.add(&events.AttemptPlaced{AttemptRef: r, JobID: job, RunnerID: 70 + job, Labels: linux},
			&events.AttemptProvisioning{AttemptRef: r}, &events.AttemptRunnerStarted{AttemptRef: r})
	}
	l.add(inProgress(1, attempt(1, 1)), inProgress(2, attempt(2, 1)))
	l.add(&events.JobInProgress{JobRef: events.JobRef{JobID: 1, RunID: 100, Labels: linux, Delivery: "again"}, RunnerName: attempt(2, 1)})
	plan := l.decide()
	want := []events.JobConflict{{JobID: 1, Runner: attempt(2, 1), BoundJob: 2}}
	if !reflect.DeepEqual(plan.Conflicts, want) {
		t.Fatalf("conflicts %+v, want %+v", plan.Conflicts, want)
	}
	if len(plan.Release) != 0 || len(plan.Teardown) != 0 {
		t.Fatalf("release %+v teardown %+v while the jobs run", plan.Release, plan.Teardown)
	}
	if again := l.decide(); !reflect.DeepEqual(again.Conflicts, want) {
		t.Fatalf("conflict not folded yet: %+v, want it decided again", again.Conflicts)
	}

	// The same job on a second runner that no other job holds.
	l = given(t).add(host("h-a", 4, 4), queued(1), queued(2))
	l.apply(l.decide())
	for _, job := range []int64{1, 2} {
		r := aref(job, 1, "h-a")
		l.add(&events.AttemptPlaced{AttemptRef: r, JobID: job, RunnerID: 70 + job, Labels: linux},
			&events.AttemptProvisioning{AttemptRef: r}, &events.AttemptRunnerStarted{AttemptRef: r})
	}
	l.add(inProgress(1, attempt(1, 1)))
	l.add(&events.JobInProgress{JobRef: events.JobRef{JobID: 1, RunID: 100, Labels: linux, Delivery: "again"}, RunnerName: attempt(2, 1)})
	plan = l.decide()
	want = []events.JobConflict{{JobID: 1, Runner: attempt(2, 1), BoundJob: 1}}
	if !reflect.DeepEqual(plan.Conflicts, want) {
		t.Fatalf("conflicts %+v, want %+v", plan.Conflicts, want)
	}
	l.add(&plan.Conflicts[0])
	for _, b := range plan.Bound {
		l.add(&b)
	}
	p := params
	p.RegistrationTimeout, p.Now = time.Minute, t0.Add(time.Hour)
	plan = dispatch.Decide(l.f, p)
	if len(plan.Release) != 0 || len(plan.Teardown) != 0 || len(plan.Deregister) != 0 {
		t.Fatalf("release %+v teardown %+v deregister %+v while the job runs on both", plan.Release, plan.Teardown, plan.Deregister)
	}
	l.add(completed(1, attempt(1, 1), "success"))
	got := attempts(dispatch.Decide(l.f, p).Release)
	if got[attempt(1, 1)] != events.ReleaseCompleted || got[attempt(2, 1)] != events.ReleaseCompleted {
		t.Fatalf("after the job completed: releases %v, want both runners released as completed", got)
	}
}
