package watchdog_test

import (
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/watchdog"
)

// Issue 17, class 1: failures charged to a host, its image or its backend
// mark the host degraded, visibly, and a successful probe lifts it.

func cref(n int, hostName string) events.AttemptRef {
	return events.AttemptRef{Attempt: events.AttemptID(int64(100+n), 1), Pool: "linux", Host: hostName}
}

// failedCreate: a booking on hostName whose create failed and whose slot
// the dispatcher released, charged to the host.
func failedCreate(n int, hostName string) []events.Payload {
	r := cref(n, hostName)
	return []events.Payload{
		&events.SlotReserved{Pool: "linux", Host: hostName, Attempt: r.Attempt, JobID: int64(100 + n), N: 1, Labels: linux},
		&events.AttemptFailed{AttemptRef: r, Step: "create", Error: "exit 1", Culprit: events.CulpritHost},
		&events.SlotReleased{Pool: "linux", Host: hostName, Attempt: r.Attempt, Reason: events.ReleaseCreateFailed,
			JobID: int64(100 + n), Culprit: events.CulpritHost},
	}
}

// silentRunner: a runner that started on hostName and never took a job;
// its slot went back at the registration deadline, charged to the image.
func silentRunner(n int, hostName string) []events.Payload {
	r := cref(n, hostName)
	return []events.Payload{
		&events.SlotReserved{Pool: "linux", Host: hostName, Attempt: r.Attempt, JobID: int64(100 + n), N: 1, Labels: linux},
		&events.AttemptRunnerStarted{AttemptRef: r},
		&events.SlotReleased{Pool: "linux", Host: hostName, Attempt: r.Attempt, Reason: events.ReleaseRegistration,
			JobID: int64(100 + n), Culprit: events.CulpritImage},
	}
}

func (l *log) fold(plan watchdog.Plan, d time.Duration) *log {
	for i := range plan.Degrade {
		l.at(d, &plan.Degrade[i])
	}
	for i := range plan.Recover {
		l.at(d, &plan.Recover[i])
	}
	for i := range plan.Raise {
		l.at(d, &plan.Raise[i])
	}
	for i := range plan.Clear {
		l.at(d, &plan.Clear[i])
	}
	return l
}

func alarmKeys(as []events.AlarmRaised) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.Key)
	}
	return out
}

// Given three creates in a row failing on h-a (two on h-b, with a success
// between), when the watchdog decides, then h-a alone is degraded, charged
// to the host, with a pool alarm.
func TestCulpritHostIsDegradedAfterRepeatedCreateFailures(t *testing.T) {
	l := given().at(0, host("h-a"), host("h-b"))
	for n := 1; n <= 3; n++ {
		l.at(time.Duration(n)*time.Second, failedCreate(n, "h-a")...)
	}
	l.at(4*time.Second, failedCreate(4, "h-b")...)
	l.at(5*time.Second, &events.AttemptRunnerStarted{AttemptRef: cref(9, "h-b")})
	l.at(6*time.Second, failedCreate(5, "h-b")...)
	l.at(7*time.Second, failedCreate(6, "h-b")...)

	plan := l.decide(10*time.Second, nil)
	if len(plan.Degrade) != 1 || plan.Degrade[0].Host != "h-a" || plan.Degrade[0].Culprit != events.CulpritHost ||
		plan.Degrade[0].Failures != 3 || plan.Degrade[0].Reason == "" {
		t.Fatalf("degraded %+v, want h-a alone, charged to the host after 3 failures, with a reason", plan.Degrade)
	}
	if keys := alarmKeys(plan.Raise); len(keys) != 1 || keys[0] != events.AlarmHostDegraded+"/linux/h-a" {
		t.Fatalf("alarms %v, want one host_degraded alarm for h-a in pool linux", keys)
	}
	l.fold(plan, 10*time.Second)
	if again := l.decide(11*time.Second, nil); len(again.Degrade)+len(again.Raise) != 0 {
		t.Fatalf("degraded again: %+v %+v", again.Degrade, again.Raise)
	}
	if st := l.f.Status(); !hostDegraded(st, "h-a") || hostDegraded(st, "h-b") {
		t.Fatalf("status hosts %+v, want h-a degraded and h-b not", st.Hosts)
	}
}

// Failures older than the window do not count.
func TestCulpritOldFailuresDoNotDegradeAHost(t *testing.T) {
	l := given().at(0, host("h-a"))
	for n := 1; n <= 3; n++ {
		l.at(time.Duration(n)*time.Second, failedCreate(n, "h-a")...)
	}
	if plan := l.decide(watchdog.DefaultDegradeWindow+2*time.Second, nil); len(plan.Degrade) != 0 {
		t.Fatalf("degraded %+v on failures older than the window", plan.Degrade)
	}
}

// Given a degraded host, when a probe's create returns (its runner
// started), then the host is recovered and its alarm cleared.
func TestCulpritDegradedHostRecoversAfterASuccessfulProbe(t *testing.T) {
	l := given().at(0, host("h-a"))
	for n := 1; n <= 3; n++ {
		l.at(time.Duration(n)*time.Second, failedCreate(n, "h-a")...)
	}
	l.fold(l.decide(10*time.Second, nil), 10*time.Second)
	if plan := l.decide(20*time.Second, nil); len(plan.Recover) != 0 {
		t.Fatalf("recovered %+v before any probe succeeded", plan.Recover)
	}
	l.at(40*time.Second, &events.AttemptRunnerStarted{AttemptRef: cref(7, "h-a")})
	plan := l.decide(41*time.Second, nil)
	if len(plan.Recover) != 1 || plan.Recover[0].Host != "h-a" {
		t.Fatalf("recovered %+v, want h-a", plan.Recover)
	}
	if len(plan.Clear) != 1 || plan.Clear[0].Key != events.AlarmHostDegraded+"/linux/h-a" {
		t.Fatalf("cleared %+v, want h-a's alarm", plan.Clear)
	}
	l.fold(plan, 41*time.Second)
	if hostDegraded(l.f.Status(), "h-a") {
		t.Fatal("status still shows h-a degraded")
	}
}

// Given runners that start and never take a job (an image GitHub no
// longer accepts), when three in a row miss the registration deadline,
// then the host is degraded charged to its image; a runner that merely
// starts again does not lift it, one that runs a job to its end does.
func TestCulpritImageFaultsDegradeTheHostUntilARunnerRunsAJob(t *testing.T) {
	l := given().at(0, host("h-a"))
	for n := 1; n <= 3; n++ {
		l.at(time.Duration(n)*time.Second, silentRunner(n, "h-a")...)
	}
	plan := l.decide(10*time.Second, nil)
	if len(plan.Degrade) != 1 || plan.Degrade[0].Culprit != events.CulpritImage {
		t.Fatalf("degraded %+v, want h-a charged to its image", plan.Degrade)
	}
	l.fold(plan, 10*time.Second)
	r := cref(8, "h-a")
	l.at(20*time.Second, &events.AttemptRunnerStarted{AttemptRef: r})
	if plan := l.decide(21*time.Second, nil); len(plan.Recover) != 0 {
		t.Fatalf("recovered %+v on a runner that only started", plan.Recover)
	}
	l.at(30*time.Second, &events.SlotReleased{Pool: "linux", Host: "h-a", Attempt: r.Attempt, Reason: events.ReleaseCompleted, JobID: 108})
	if plan := l.decide(31*time.Second, nil); len(plan.Recover) != 1 {
		t.Fatalf("recovered %+v, want h-a once a runner ran a job", plan.Recover)
	}
}

// The watchdog's own releases name their culprit: a booking that never got
// a JIT config is GitHub's, one placed and not started its host's.
func TestCulpritWatchdogChargesProvisionTimeouts(t *testing.T) {
	unplaced, placed := cref(1, "h-a"), cref(2, "h-a")
	l := given().at(0, host("h-a"),
		&events.SlotReserved{Pool: "linux", Host: "h-a", Attempt: unplaced.Attempt, JobID: 101, N: 1, Labels: linux},
		&events.SlotReserved{Pool: "linux", Host: "h-a", Attempt: placed.Attempt, JobID: 102, N: 1, Labels: linux},
		&events.AttemptPlaced{AttemptRef: placed, JobID: 102, Labels: linux})
	plan := l.decide(params.ProvisionTimeout+time.Second, nil)
	got := map[string]string{}
	for _, r := range plan.Release {
		got[r.Attempt] = r.Culprit
	}
	if got[unplaced.Attempt] != events.CulpritGitHub || got[placed.Attempt] != events.CulpritHost {
		t.Fatalf("release culprits %v, want %s github and %s host", got, unplaced.Attempt, placed.Attempt)
	}
}

// Given a placed attempt whose runner did not start in time and a runner
// that started and took no job in time, when the watchdog itself saw NATS
// fail after they were booked (its consumer lost a delivery, an append or
// a probe write failed), then both releases are charged to NATS, not to
// the host or the image: the facts that would have met the deadlines may
// not have reached the log. A fault before the booking changes nothing
// (law 11; a chaos run degraded a host whose agent could not read the
// log while NATS nodes were killed).
func TestCulpritADeadlineAcrossAFaultOfNATSIsNATSs(t *testing.T) {
	placed, started := cref(1, "h-a"), cref(2, "h-a")
	booked := 10 * time.Second
	l := given().at(0, host("h-a")).at(booked,
		&events.SlotReserved{Pool: "linux", Host: "h-a", Attempt: placed.Attempt, JobID: 101, N: 1, Labels: linux},
		&events.AttemptPlaced{AttemptRef: placed, JobID: 101, Labels: linux},
		&events.SlotReserved{Pool: "linux", Host: "h-a", Attempt: started.Attempt, JobID: 102, N: 1, Labels: linux},
		&events.AttemptPlaced{AttemptRef: started, JobID: 102, Labels: linux},
		&events.AttemptProvisioning{AttemptRef: started}, &events.AttemptRunnerStarted{AttemptRef: started})
	now := t0.Add(booked + params.ProvisionTimeout + time.Second)
	culprits := func(fault time.Time) map[string]string {
		p := params
		p.RegistrationTimeout, p.NATSFaultAt = time.Minute, fault
		got := map[string]string{}
		for _, r := range watchdog.Decide(l.f, now, map[string]time.Time{"h-a": now}, p).Release {
			got[r.Attempt] = r.Culprit
		}
		return got
	}
	if got := culprits(t0.Add(booked + time.Minute)); got[placed.Attempt] != events.CulpritNATS || got[started.Attempt] != events.CulpritNATS {
		t.Fatalf("with NATS failing after the bookings: culprits %v, want nats for both", got)
	}
	if got := culprits(t0.Add(booked - time.Second)); got[placed.Attempt] != events.CulpritHost || got[started.Attempt] != events.CulpritImage {
		t.Fatalf("with NATS failing before the bookings: culprits %v, want %s host and %s image", got, placed.Attempt, started.Attempt)
	}
}

// GitHub refusing the App's credentials raises a fleet alarm, cleared by
// the next placement.
func TestCulpritGitHubRefusalRaisesAnAlarmUntilAPlacement(t *testing.T) {
	r := cref(1, "h-a")
	l := given().at(0, host("h-a"),
		&events.SlotReserved{Pool: "linux", Host: "h-a", Attempt: r.Attempt, JobID: 101, N: 1, Labels: linux},
		&events.SlotReleased{Pool: "linux", Host: "h-a", Attempt: r.Attempt, Reason: events.ReleaseGitHubRefused, JobID: 101})
	plan := l.decide(time.Second, nil)
	if keys := alarmKeys(plan.Raise); len(keys) != 1 || keys[0] != events.AlarmGitHubRefused+"/fleet" {
		t.Fatalf("alarms %v, want github_refused/fleet", keys)
	}
	l.fold(plan, time.Second)
	r2 := cref(2, "h-a")
	l.at(2*time.Second, &events.AttemptPlaced{AttemptRef: r2, JobID: 102, Labels: linux})
	if plan := l.decide(3*time.Second, nil); len(plan.Clear) != 1 || plan.Clear[0].Key != events.AlarmGitHubRefused+"/fleet" {
		t.Fatalf("cleared %+v, want github_refused/fleet", plan.Clear)
	}
}

func hostDegraded(st events.Status, name string) bool {
	for _, h := range st.Hosts {
		if h.Name == name {
			return h.Degraded
		}
	}
	return false
}
