package watchdog_test

import (
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/watchdog"
)

// boundAndRunning: job id runs on attempt 1 on h, its binding recorded by
// the dispatcher, so the attempt is quiet: it holds its slot for a job
// its runner runs, and only the clock can make it overdue.
func boundAndRunning(t *testing.T, l *log, id int64, h string) {
	t.Helper()
	l.at(0, running(id, h)...).at(0, &events.AttemptBound{AttemptRef: aref(id, h), JobID: id})
	for a := range l.f.UnquietAttempts() {
		if a.ID == aref(id, h).Attempt {
			t.Fatalf("attempt %s is not quiet (bound %d, job %+v): the test is not about a quiet attempt", a.ID, a.BoundJobID, l.f.Jobs[id])
		}
	}
}

// Given a quiet attempt whose job runs past MaxJobDuration, then the
// watchdog releases its slot as overrun, though its round no longer walks
// every running job.
func TestAQuietAttemptWhoseJobRunsTooLongIsReleased(t *testing.T) {
	p := params
	p.MaxJobDuration = time.Hour
	l := given().at(0, host("h-a"))
	boundAndRunning(t, l, 1, "h-a")
	decide := func(d time.Duration) watchdog.Plan {
		return watchdog.Decide(l.f, t0.Add(d), map[string]time.Time{"h-a": t0.Add(d)}, p)
	}
	if plan := decide(59 * time.Minute); len(plan.Release) != 0 {
		t.Fatalf("59 minutes into an hour's limit: release %+v, want none", plan.Release)
	}
	if got := released(decide(time.Hour + time.Second).Release); got[aref(1, "h-a").Attempt] != events.ReleaseMaxDuration {
		t.Fatalf("past the limit: released %v, want %s released as %s", got, aref(1, "h-a").Attempt, events.ReleaseMaxDuration)
	}
}

// Given a quiet attempt whose VM stopped while its slot is still held (the
// job's completed webhook never came), then the watchdog raises the slot
// leak alarm once the grace has passed, and not before.
func TestAQuietAttemptWhoseVMStoppedRaisesTheLeakAlarm(t *testing.T) {
	l := given().at(0, host("h-a"))
	boundAndRunning(t, l, 1, "h-a")
	l.at(time.Minute, &events.AttemptStopped{AttemptRef: aref(1, "h-a")})
	if plan := l.decide(time.Minute+params.LeakGrace, nil); len(plan.Raise) != 0 {
		t.Fatalf("at the grace: alarms %+v, want none yet", plan.Raise)
	}
	plan := l.decide(time.Minute+params.LeakGrace+time.Second, nil)
	if len(plan.Raise) != 1 || plan.Raise[0].Kind != events.AlarmSlotLeak || plan.Raise[0].Pool != "linux" {
		t.Fatalf("past the grace: alarms %+v, want the slot leak alarm of pool linux", plan.Raise)
	}
}

// Given an operator's teardown of a quiet attempt (its job still runs), when
// no stop comes within the teardown deadline, then the watchdog records
// the VM abandoned.
func TestAnOperatorsTeardownOfAQuietAttemptThatOverrunsIsAbandoned(t *testing.T) {
	l := given().at(0, host("h-a"))
	boundAndRunning(t, l, 1, "h-a")
	ask := events.NewBy("cli", events.RoleCLI, t0.Add(time.Minute),
		&events.AttemptTeardownRequested{AttemptRef: aref(1, "h-a"), Reason: "operator"})
	ask.Seq = 100
	l.f.Apply(ask)
	if plan := l.decide(time.Minute+params.TeardownTimeout, nil); len(plan.Abandon) != 0 {
		t.Fatalf("at the deadline: abandon %+v, want none yet", plan.Abandon)
	}
	plan := l.decide(time.Minute+params.TeardownTimeout+time.Second, nil)
	if len(plan.Abandon) != 1 || plan.Abandon[0].Attempt != aref(1, "h-a").Attempt {
		t.Fatalf("past the deadline: abandon %+v, want %s", plan.Abandon, aref(1, "h-a").Attempt)
	}
}
