package watchdog_test

import (
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/watchdog"
)

// abandon: job id ran on h, completed, its slot was released, and its stop
// overran: the VM is abandoned and still occupies h.
func abandon(id int64, h string) []events.Payload {
	r := aref(id, h)
	return append(running(id, h), &events.JobCompleted{JobRef: job(id), RunnerName: r.Attempt, Conclusion: "success"},
		release(id, h, events.ReleaseCompleted), &events.AttemptTeardownRequested{AttemptRef: r, Reason: "completed"},
		&events.AttemptAbandoned{AttemptRef: r, Step: "stop", After: time.Minute})
}

// Given a host whose stops keep overrunning (BL-01, BL-28), when its
// abandoned VMs reach the cap, then the watchdog cordons it with the count,
// the cap and what to do; when a late stop brings it below the cap, the
// watchdog lifts its own cordon without a restart.
func TestAbandonedCapCordonsAndALateStopLiftsIt(t *testing.T) {
	l := given().at(0, host("h-a"))
	l.at(time.Minute, abandon(1, "h-a")...)
	if plan := l.decide(2*time.Minute, nil); len(plan.Cordon) != 0 {
		t.Fatalf("one abandoned VM under a cap of %d: cordon %+v", params.AbandonedCap, plan.Cordon)
	}
	l.at(2*time.Minute, abandon(2, "h-a")...)
	plan := l.decide(3*time.Minute, nil)
	if len(plan.Cordon) != 1 || plan.Cordon[0].Host != "h-a" || plan.Cordon[0].By != "watchdog" {
		t.Fatalf("at the cap: cordon %+v", plan.Cordon)
	}
	for _, say := range []string{"2 abandoned VMs", "cap of 2", "stop them by hand", "lifts by itself"} {
		if !strings.Contains(plan.Cordon[0].Reason, say) {
			t.Errorf("cordon reason %q does not say %q", plan.Cordon[0].Reason, say)
		}
	}
	l.at(3*time.Minute, &plan.Cordon[0])
	if plan := l.decide(4*time.Minute, nil); len(plan.Cordon)+len(plan.Uncordon) != 0 {
		t.Fatalf("cordoned and still at the cap: %+v", plan)
	}
	l.at(5*time.Minute, &events.AttemptStopped{AttemptRef: aref(1, "h-a"), Late: true})
	plan = l.decide(6*time.Minute, nil)
	if len(plan.Uncordon) != 1 || plan.Uncordon[0].Host != "h-a" {
		t.Fatalf("late stop: uncordon %+v", plan.Uncordon)
	}
}

// Given an operator's cordon, the watchdog never lifts it, whatever the
// abandoned count.
func TestWatchdogNeverLiftsAnOperatorsCordon(t *testing.T) {
	l := given().at(0, host("h-a"),
		&events.HostCordoned{HostChange: events.HostChange{Host: "h-a", Reason: "maintenance", By: "ops", At: t0}})
	if plan := l.decide(time.Minute, nil); len(plan.Uncordon) != 0 {
		t.Fatalf("operator cordon lifted: %+v", plan.Uncordon)
	}
}

// Given an agent that announced itself and died before its first heartbeat,
// when the TTL passes, then its host is lost like any other.
func TestAHostThatNeverHeartbeatIsLostAfterTheTTL(t *testing.T) {
	l := given().at(0, host("h-a"))
	if plan := watchdogDecide(l, params.HostTTL-time.Second); len(plan.Lost) != 0 {
		t.Fatalf("before the TTL: %+v", plan.Lost)
	}
	if plan := watchdogDecide(l, params.HostTTL+time.Second); len(plan.Lost) != 1 {
		t.Fatalf("after the TTL with no heartbeat: lost %+v", plan.Lost)
	}
}

// Given two pools, one with a slot no live attempt accounts for and one busy
// with tracked work, the leak alarm names only the leaking pool: each pool is
// judged by itself.
func TestLeakAlarmIsScopedToThePoolThatLeaks(t *testing.T) {
	l := given().at(0, &events.HostOnline{Host: "h-a", Boot: "b1", PhysicalCap: 8, CurveKey: "X", Backend: "exec",
		Pools: map[string]events.PoolSlots{"linux": {Labels: linux, Slots: 2}, "macos": {Labels: []string{"macos", "self-hosted"}, Slots: 2}}})
	// linux: attempt 1 holds a slot though its VM stopped.
	r := aref(1, "h-a")
	l.at(time.Minute, append(running(1, "h-a"), &events.AttemptStopped{AttemptRef: r})...)
	// macos: two attempts busy running their jobs.
	for _, id := range []int64{2, 3} {
		ref := events.AttemptRef{Attempt: events.AttemptID(id, 1), Pool: "macos", Host: "h-a"}
		j := events.JobRef{JobID: id, RunID: 9, Labels: []string{"macos", "self-hosted"}}
		l.at(time.Minute, &events.JobQueued{JobRef: j},
			&events.SlotReserved{Pool: "macos", Host: "h-a", Attempt: ref.Attempt, JobID: id, N: 1},
			&events.AttemptPlaced{AttemptRef: ref, JobID: id}, &events.AttemptProvisioning{AttemptRef: ref},
			&events.AttemptRunnerStarted{AttemptRef: ref}, &events.JobInProgress{JobRef: j, RunnerName: ref.Attempt})
	}
	plan := l.decide(time.Minute+params.LeakGrace+time.Second, nil)
	if len(plan.Raise) != 1 || plan.Raise[0].Pool != "linux" {
		t.Fatalf("want one alarm for linux only: %+v", plan.Raise)
	}
}

// Given a VM whose runner started but never takes a job while its pool has
// demand (BL-11: the boot script failed after the runner process started),
// when the registration deadline passes, then its slot is released and the
// VM torn down, so the job can be placed again; a runner bound to a job is
// never touched.
func TestARunnerThatNeverTakesAJobIsReleasedAtTheRegistrationDeadline(t *testing.T) {
	p := params
	p.RegistrationTimeout = 5 * time.Minute
	r := aref(1, "h-a")
	l := given().at(0, host("h-a")).at(time.Minute, placed(1, "h-a")...)
	l.at(time.Minute, &events.AttemptProvisioning{AttemptRef: r}, &events.AttemptRunnerStarted{AttemptRef: r})
	if plan := decideWith(l, time.Minute+p.RegistrationTimeout-time.Second, p); len(plan.Release) != 0 {
		t.Fatalf("before the deadline: %+v", plan.Release)
	}
	plan := decideWith(l, time.Minute+p.RegistrationTimeout+time.Second, p)
	if got := released(plan.Release); got[r.Attempt] != events.ReleaseRegistration || len(plan.Teardown) != 1 {
		t.Fatalf("after the deadline: release %v teardown %+v", got, plan.Teardown)
	}
	l.at(2*time.Minute, &events.JobInProgress{JobRef: job(1), RunnerName: r.Attempt})
	if plan := decideWith(l, time.Hour, p); len(plan.Release) != 0 {
		t.Fatalf("bound runner released: %+v", plan.Release)
	}
}

func decideWith(l *log, d time.Duration, p watchdog.Params) watchdog.Plan {
	beats := map[string]time.Time{}
	for h := range l.f.Hosts {
		beats[h] = t0.Add(d)
	}
	return watchdog.Decide(l.f, t0.Add(d), beats, p)
}

// Given a job that has been in progress longer than the maximum job
// duration, its slot is released (max_duration) and its VM torn down; a job
// within the limit is left alone.
func TestAJobPastItsMaximumDurationIsReleased(t *testing.T) {
	p := params
	p.MaxJobDuration = time.Hour
	l := given().at(0, host("h-a")).at(time.Minute, running(1, "h-a")...)
	if plan := decideWith(l, time.Minute+time.Hour-time.Second, p); len(plan.Release) != 0 {
		t.Fatalf("within the limit: %+v", plan.Release)
	}
	plan := decideWith(l, time.Minute+time.Hour+time.Second, p)
	if got := released(plan.Release); got[events.AttemptID(1, 1)] != events.ReleaseMaxDuration || len(plan.Teardown) != 1 {
		t.Fatalf("past the limit: release %v teardown %+v", got, plan.Teardown)
	}
}
