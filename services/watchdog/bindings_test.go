package watchdog_test

import (
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/watchdog"
)

// registered: job id is queued, attempt 1 booked and placed on h with a
// runner registered with GitHub, and that runner started at t0.
func registered(id int64, h string) []events.Payload {
	r := aref(id, h)
	return []events.Payload{&events.JobQueued{JobRef: job(id)}, reserve(id, h),
		&events.AttemptPlaced{AttemptRef: r, JobID: id, RunnerID: 700 + id},
		&events.AttemptProvisioning{AttemptRef: r}, &events.AttemptRunnerStarted{AttemptRef: r}}
}

// Issue 17: given a runner past the watchdog's own registration fallback
// that GitHub called busy (a dispatcher's 422, recorded as a fact), then the
// watchdog neither releases nor tears it down while the answer is recent
// (FallbackFactor × RunnerBusyFor), and falls back once it is stale.
func TestTheWatchdogLeavesARunnerGitHubCallsBusyAlone(t *testing.T) {
	p := params
	p.RegistrationTimeout = 10 * time.Minute
	past := watchdog.FallbackFactor*p.RegistrationTimeout + time.Minute
	l := given().at(0, host("h-a")).at(0, registered(1, "h-a")...)
	l.at(past-time.Minute, &events.AttemptRunnerBusy{AttemptRef: aref(1, "h-a"), RunnerID: 701, At: t0.Add(past - time.Minute)})
	decide := func(d time.Duration) watchdog.Plan {
		seen := map[string]time.Time{"h-a": t0.Add(d)}
		return watchdog.Decide(l.f, t0.Add(d), seen, p)
	}
	if plan := decide(past); len(plan.Release) != 0 || len(plan.Teardown) != 0 {
		t.Fatalf("GitHub said busy a minute ago: release %+v teardown %+v, want neither", plan.Release, plan.Teardown)
	}
	stale := past - time.Minute + watchdog.FallbackFactor*events.RunnerBusyFor + time.Second
	if plan := decide(stale); released(plan.Release)[aref(1, "h-a").Attempt] != events.ReleaseRegistration {
		t.Fatalf("busy answer stale: release %+v, want the registration fallback", plan.Release)
	}
}

// Issue 17: given a VM whose teardown was asked before its binding was
// known (the create failed, then its runner took a job), then the agent
// keeps it while the job runs and the watchdog does not call that an
// overrun stop (no abandonment) however long the job runs.
func TestTheWatchdogDoesNotAbandonAVMThatRunsAJob(t *testing.T) {
	r := aref(1, "h-a")
	l := given().at(0, host("h-a")).at(0, registered(1, "h-a")...).at(time.Second,
		&events.AttemptFailed{AttemptRef: r, Step: "create", Error: "exit 1"},
		release(1, "h-a", events.ReleaseCreateFailed),
		&events.AttemptTeardownRequested{AttemptRef: r, Reason: events.ReleaseCreateFailed},
		&events.JobInProgress{JobRef: job(1), RunnerName: r.Attempt},
		&events.AttemptBound{AttemptRef: r, JobID: 1})
	if plan := l.decide(time.Hour, nil); len(plan.Abandon) != 0 || len(plan.Release) != 0 {
		t.Fatalf("an hour into the job: abandon %+v release %+v, want neither", plan.Abandon, plan.Release)
	}
	l.at(2*time.Hour, &events.AttemptBound{AttemptRef: r, JobID: 1, Ended: true})
	if plan := l.decide(2*time.Hour+params.TeardownTimeout+time.Second, nil); len(plan.Abandon) != 1 {
		t.Fatalf("the job ended and its stop overran: abandon %+v, want one", plan.Abandon)
	}
}
