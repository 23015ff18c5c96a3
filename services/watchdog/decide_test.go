package watchdog_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/services/watchdog"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testkit.LeakOptions()...) }

// The fake clock: every fact and every Decide happens at t0 + an offset.
var t0 = time.Date(2025, 3, 1, 9, 0, 0, 0, time.UTC)

var params = watchdog.Params{
	ProvisionTimeout:   10 * time.Minute,
	TeardownTimeout:    2 * time.Minute,
	HostTTL:            30 * time.Second,
	DemandWaitingAfter: 30 * time.Second,
	DemandWaitingEvery: 5 * time.Minute,
	LeakGrace:          time.Minute,
	AbandonedCap:       2,
}

type log struct {
	f *events.Fleet
	n uint64
}

func given() *log { return &log{f: events.NewFleet()} }

// at folds facts stamped t0+d, each at the next stream sequence.
func (l *log) at(d time.Duration, ps ...events.Payload) *log {
	for _, p := range ps {
		l.n++
		e := events.New("test", t0.Add(d), p)
		e.Seq = l.n
		testkit.ApplyGranted(l.f, e)
	}
	return l
}

// decide asks the watchdog at t0+d; heartbeats are given as ages at that
// time; every other known host heartbeat just now.
func (l *log) decide(d time.Duration, ages map[string]time.Duration) watchdog.Plan {
	beats := map[string]time.Time{}
	for h := range l.f.Hosts {
		beats[h] = t0.Add(d)
	}
	for h, age := range ages {
		beats[h] = t0.Add(d - age)
	}
	return watchdog.Decide(l.f, t0.Add(d), beats, params)
}

var linux = []string{"linux", "self-hosted"}

// watchdogDecide asks with no heartbeat at all: the watchdog saw every
// host only announce itself, at t0.
func watchdogDecide(l *log, d time.Duration) watchdog.Plan {
	seen := map[string]time.Time{}
	for h := range l.f.Hosts {
		seen[h] = t0
	}
	return watchdog.Decide(l.f, t0.Add(d), seen, params)
}

func host(name string) *events.HostOnline {
	return &events.HostOnline{Host: name, Boot: "b1", PhysicalCap: 4, CurveKey: "X" + name, Backend: "exec",
		Pools: map[string]events.PoolSlots{"linux": {Labels: linux, Slots: 2}}}
}

func job(id int64, labels ...string) events.JobRef {
	if labels == nil {
		labels = linux
	}
	return events.JobRef{JobID: id, RunID: 9, Labels: labels}
}

func aref(id int64, h string) events.AttemptRef {
	return events.AttemptRef{Attempt: events.AttemptID(id, 1), Pool: "linux", Host: h}
}

func reserve(id int64, h string) *events.SlotReserved {
	return &events.SlotReserved{Pool: "linux", Host: h, Attempt: events.AttemptID(id, 1), JobID: id, N: 1, Labels: linux}
}

func release(id int64, h, reason string) *events.SlotReleased {
	return &events.SlotReleased{Pool: "linux", Host: h, Attempt: events.AttemptID(id, 1), Reason: reason, JobID: id}
}

// placed: job id is queued and attempt 1 booked and placed on h.
func placed(id int64, h string) []events.Payload {
	return []events.Payload{&events.JobQueued{JobRef: job(id)}, reserve(id, h), &events.AttemptPlaced{AttemptRef: aref(id, h), JobID: id}}
}

// running: the attempt's runner started and took its job.
func running(id int64, h string) []events.Payload {
	r := aref(id, h)
	return append(placed(id, h), &events.AttemptProvisioning{AttemptRef: r}, &events.AttemptRunnerStarted{AttemptRef: r},
		&events.JobInProgress{JobRef: job(id), RunnerName: r.Attempt})
}

func released(rs []events.SlotReleased) map[string]string {
	out := map[string]string{}
	for _, r := range rs {
		out[r.Attempt] = r.Reason
	}
	return out
}

func TestProvisioningDeadlineReleasesThenTearsDown(t *testing.T) {
	pt := params.ProvisionTimeout
	l := given().at(0, host("h-a")).at(0, placed(1, "h-a")...)

	if plan := l.decide(pt, nil); len(plan.Release)+len(plan.Teardown) != 0 {
		t.Fatalf("at the deadline: %+v, want nothing yet", plan)
	}
	plan := l.decide(pt+2*time.Second, nil)
	wantR := []events.SlotReleased{*release(1, "h-a", events.ReleaseProvisionTimeout)}
	wantR[0].Culprit = events.CulpritHost // placed, no runner in time: its host's (law 11)
	wantT := []events.AttemptTeardownRequested{{AttemptRef: aref(1, "h-a"), Reason: events.ReleaseProvisionTimeout}}
	if !reflect.DeepEqual(plan.Release, wantR) || !reflect.DeepEqual(plan.Teardown, wantT) {
		t.Fatalf("past the deadline: release %+v teardown %+v, want %+v then %+v", plan.Release, plan.Teardown, wantR, wantT)
	}

	notPlaced := given().at(0, host("h-a"), &events.JobQueued{JobRef: job(1)}, reserve(1, "h-a"))
	if plan := notPlaced.decide(pt+2*time.Second, nil); len(plan.Release) != 1 || len(plan.Teardown) != 0 {
		t.Fatalf("never placed: %+v, want a release and no teardown (no VM to stop)", plan)
	}
}

func TestProvisioningDeadlineSparesStartedOrBoundAttempts(t *testing.T) {
	r := aref(1, "h-a")
	cases := map[string]events.Payload{
		"runner started":        &events.AttemptRunnerStarted{AttemptRef: r},
		"bound to another job":  &events.JobInProgress{JobRef: job(2), RunnerName: r.Attempt},
		"bound to its own job":  &events.JobInProgress{JobRef: job(1), RunnerName: r.Attempt},
		"bound by a completion": &events.JobCompleted{JobRef: job(2), RunnerName: r.Attempt, Conclusion: "success"},
	}
	for name, fact := range cases {
		l := given().at(0, host("h-a")).at(0, placed(1, "h-a")...).at(time.Minute, fact)
		if plan := l.decide(time.Hour, nil); len(plan.Release)+len(plan.Teardown) != 0 {
			t.Errorf("%s: %+v, want no provisioning release", name, plan)
		}
	}
}

func TestTeardownDeadlineAbandonsTheStop(t *testing.T) {
	tt, asked := params.TeardownTimeout, 10*time.Minute
	r := aref(1, "h-a")
	given := func() *log {
		return given().at(0, host("h-a")).at(0, running(1, "h-a")...).at(asked,
			&events.JobCompleted{JobRef: job(1), RunnerName: r.Attempt, Conclusion: "success"},
			release(1, "h-a", events.ReleaseCompleted),
			&events.AttemptTeardownRequested{AttemptRef: r, Reason: events.ReleaseCompleted})
	}

	if plan := given().decide(asked+tt-time.Second, nil); len(plan.Abandon) != 0 {
		t.Fatalf("before the deadline: abandon %+v", plan.Abandon)
	}
	plan := given().decide(asked+tt+time.Second, nil)
	want := []events.AttemptAbandoned{{AttemptRef: r, Step: "stop", After: tt}}
	if !reflect.DeepEqual(plan.Abandon, want) || len(plan.Release) != 0 {
		t.Fatalf("past the deadline: %+v, want abandon %+v and no release", plan, want)
	}

	stopped := given().at(asked+time.Minute, &events.AttemptStopped{AttemptRef: r})
	if plan := stopped.decide(asked+time.Hour, nil); len(plan.Abandon) != 0 {
		t.Fatalf("stopped: abandon %+v", plan.Abandon)
	}
	abandoned := given().at(asked+tt+time.Second, &want[0])
	if plan := abandoned.decide(asked+time.Hour, nil); len(plan.Abandon) != 0 {
		t.Fatalf("already abandoned: abandon %+v", plan.Abandon)
	}
}

// BL-06: the host stops heartbeating (crashed agent, rebooted host). Its
// silence is a negative read (law 7): a NATS outage silences hosts whose VMs
// still run. So a slot whose runner took a job stays held (the job's
// completed webhook releases it); a booking with no runner registered goes
// back at once; a registered, idle runner is left to the dispatcher, which
// deletes its registration first, and the watchdog releases it on the
// silence alone only FallbackFactor × HostTTL after the host was lost.
func TestHostLostReleasesOnlyWhatNoRunningJobHolds(t *testing.T) {
	now := 5 * time.Minute
	registered := func(id int64, h string) []events.Payload {
		return []events.Payload{&events.JobQueued{JobRef: job(id)}, reserve(id, h),
			&events.AttemptPlaced{AttemptRef: aref(id, h), JobID: id, RunnerID: 700 + id}}
	}
	l := given().at(0, host("h-a"), host("h-b")).at(0, running(1, "h-a")...).at(0, placed(2, "h-a")...)
	l.at(0, running(3, "h-a")...).at(time.Minute, &events.JobCompleted{JobRef: job(3), RunnerName: "berth-3-1"},
		release(3, "h-a", events.ReleaseCompleted)).at(0, running(4, "h-b")...)
	l.at(0, registered(5, "h-a")...).at(0, &events.JobQueued{JobRef: job(6)}, reserve(6, "h-a"))
	fresh := map[string]time.Duration{"h-a": params.HostTTL - time.Second, "h-b": time.Second}
	stale := map[string]time.Duration{"h-a": params.HostTTL + time.Second, "h-b": time.Second}

	if plan := l.decide(now, fresh); len(plan.Lost)+len(plan.Release) != 0 {
		t.Fatalf("heartbeat within ttl: %+v, want nothing", plan)
	}
	plan := l.decide(now, stale)
	if len(plan.Lost) != 1 || plan.Lost[0].Host != "h-a" || !plan.Lost[0].At.Equal(t0.Add(now)) || plan.Lost[0].Reason == "" {
		t.Fatalf("lost %+v, want h-a lost now with a reason", plan.Lost)
	}
	atOnce := map[string]string{"berth-2-1": events.ReleaseHostLost, "berth-6-1": events.ReleaseHostLost}
	if got := released(plan.Release); !reflect.DeepEqual(got, atOnce) || len(plan.Teardown) != 1 {
		t.Fatalf("release %v teardown %d, want %v (not berth-1-1 whose job runs, not berth-5-1 whose runner is registered, "+
			"not berth-3-1 again, not h-b's) and berth-2-1's teardown", got, len(plan.Teardown), atOnce)
	}

	l.at(now, &plan.Lost[0])
	plan = l.decide(now+time.Second, stale)
	if got := released(plan.Release); len(plan.Lost) != 0 || !reflect.DeepEqual(got, atOnce) {
		t.Fatalf("host lost folded, slots not yet: lost %+v release %v, want no second loss and %v", plan.Lost, got, atOnce)
	}
	late := now + watchdog.FallbackFactor*params.HostTTL
	if got := released(l.decide(late, stale).Release); got["berth-5-1"] != "" {
		t.Fatalf("registered runner released at the fallback itself: %v", got)
	}
	got := released(l.decide(late+time.Second, stale).Release)
	if got["berth-5-1"] != events.ReleaseHostLost || got["berth-1-1"] != "" {
		t.Fatalf("after %d× the ttl: release %v, want berth-5-1 released and berth-1-1 (job running) still held", watchdog.FallbackFactor, got)
	}
}

func TestWaitingDemandIsReportedAfterAWhileThenEveryPeriod(t *testing.T) {
	after, every, q := params.DemandWaitingAfter, params.DemandWaitingEvery, 10*time.Second
	l := given().at(0, host("h-a")).at(0, running(1, "h-a")...).at(0, running(2, "h-a")...)
	l.at(q, &events.JobQueued{JobRef: job(3)}).at(q+5*time.Second, &events.JobQueued{JobRef: job(4)})

	if plan := l.decide(q+after-time.Second, nil); len(plan.Demand) != 0 {
		t.Fatalf("waited under %s: demand %+v", after, plan.Demand)
	}
	first := q + after + 10*time.Second
	plan := l.decide(first, nil)
	if len(plan.Demand) != 1 {
		t.Fatalf("demand %+v, want one report for pool linux", plan.Demand)
	}
	d := plan.Demand[0]
	if d.Pool != "linux" || d.Jobs != 2 || d.OldestJobID != 3 || d.Waited != after+10*time.Second ||
		!d.At.Equal(t0.Add(first)) || d.Reason == "" {
		t.Fatalf("report %+v, want pool linux, 2 jobs, oldest 3, waited %s, a reason", d, after+10*time.Second)
	}

	l.at(first, &d)
	if plan := l.decide(first+every-time.Second, nil); len(plan.Demand) != 0 {
		t.Fatalf("%s after the last report: demand %+v, want quiet", every-time.Second, plan.Demand)
	}
	if plan := l.decide(first+every+time.Second, nil); len(plan.Demand) != 1 || plan.Demand[0].Jobs != 2 {
		t.Fatalf("%s after the last report: demand %+v, want a new report", every+time.Second, plan.Demand)
	}
}

func TestGitHubHostedJobsAreNeverReportedAsWaiting(t *testing.T) {
	cases := []struct {
		labels []string
		pool   string
	}{
		{[]string{"ubuntu-latest"}, ""},
		{[]string{"macos-14", "arm64"}, ""},
		{[]string{"self-hosted", "gpu"}, "unmatched"},
	}
	for _, c := range cases {
		l := given().at(0, host("h-a"), &events.JobQueued{JobRef: job(7, c.labels...)})
		plan := l.decide(time.Hour, nil)
		var got string
		if len(plan.Demand) == 1 {
			got = plan.Demand[0].Pool
		}
		if got != c.pool || len(plan.Demand) > 1 {
			t.Errorf("labels %v: demand %+v, want pool %q", c.labels, plan.Demand, c.pool)
		}
	}
}

// A held slot whose VM is gone is accounted for by nothing (law 6).
func TestSlotHeldByAStoppedAttemptRaisesALeakAlarmUntilReleased(t *testing.T) {
	grace, stop := params.LeakGrace, 3*time.Minute
	r := aref(1, "h-a")
	l := given().at(0, host("h-a")).at(0, running(1, "h-a")...).at(stop, &events.AttemptStopped{AttemptRef: r})

	if plan := l.decide(stop+grace-time.Second, nil); len(plan.Raise) != 0 {
		t.Fatalf("within grace: raise %+v", plan.Raise)
	}
	now := stop + grace + time.Second
	plan := l.decide(now, nil)
	if len(plan.Raise) != 1 || len(plan.Release) != 0 {
		t.Fatalf("past grace: %+v, want one alarm and no release on a guess", plan)
	}
	a := plan.Raise[0]
	if a.Key != "slot_leak/linux" || a.Kind != events.AlarmSlotLeak || a.Pool != "linux" || !a.At.Equal(t0.Add(now)) {
		t.Fatalf("alarm %+v", a)
	}
	for _, say := range []string{"berth-1-1", "h-a", "berth replay --check", "berth release"} {
		if !strings.Contains(a.Message, say) {
			t.Errorf("alarm message %q does not say %q", a.Message, say)
		}
	}

	l.at(now, &a)
	if plan := l.decide(now+time.Minute, nil); len(plan.Raise)+len(plan.Clear) != 0 {
		t.Fatalf("alarm active, slot still held: raise %+v clear %+v, want neither", plan.Raise, plan.Clear)
	}

	l.at(now+2*time.Minute, release(1, "h-a", events.ReleaseCompleted))
	plan = l.decide(now+3*time.Minute, nil)
	want := []events.AlarmCleared{{Key: a.Key, Pool: "linux", At: t0.Add(now + 3*time.Minute)}}
	if !reflect.DeepEqual(plan.Clear, want) || len(plan.Raise) != 0 {
		t.Fatalf("slot released: clear %+v raise %+v, want %+v", plan.Clear, plan.Raise, want)
	}
	l.at(now+3*time.Minute, &want[0])
	if plan := l.decide(now+4*time.Minute, nil); len(plan.Raise)+len(plan.Clear) != 0 {
		t.Fatalf("alarm cleared: %+v, want quiet", plan)
	}
}

// A warm VM (issue 8) is held to the provisioning deadline while it boots
// and, once a job claims it, from the claim; idle, it waits for a job and
// no deadline applies (its maximum idle age recycles it).
func TestWarmVMsProvisioningDeadlines(t *testing.T) {
	r := func(id string) events.AttemptRef { return events.AttemptRef{Attempt: id, Pool: "linux", Host: "h-a"} }
	book := func(id string, n int) []events.Payload {
		return []events.Payload{&events.SlotReserved{Pool: "linux", Host: "h-a", Attempt: id, N: n, Labels: linux, Warm: true},
			&events.AttemptPlaced{AttemptRef: r(id), Labels: linux, Warm: true}, &events.AttemptProvisioning{AttemptRef: r(id)}}
	}
	booting, idle, claimed := events.WarmAttemptID("linux", 1), events.WarmAttemptID("linux", 2), events.WarmAttemptID("linux", 3)
	l := given().at(0, host("h-a")).at(0, book(booting, 1)...).at(0, book(idle, 2)...).at(0, book(claimed, 3)...)
	l.at(time.Second, &events.AttemptReady{AttemptRef: r(idle)}, &events.AttemptReady{AttemptRef: r(claimed)})
	claimAt := 2 * time.Hour
	l.at(claimAt, &events.JobQueued{JobRef: job(9)}, &events.AttemptClaimed{Pool: "linux", Host: "h-a", Attempt: claimed, JobID: 9})

	got := released(l.decide(claimAt+time.Second, nil).Release)
	if got[booting] != events.ReleaseProvisionTimeout || got[idle] != "" || got[claimed] != "" {
		t.Fatalf("releases %v: want the VM still booting after 2h released, the idle one and the one just claimed kept", got)
	}
	got = released(l.decide(claimAt+params.ProvisionTimeout+time.Second, nil).Release)
	if got[claimed] != events.ReleaseProvisionTimeout || got[idle] != "" {
		t.Fatalf("releases %v: want the claimed VM released %s after its claim with no runner, the idle one kept", got, params.ProvisionTimeout)
	}
}

// The walk of live attempts is in the fold's map order; the plan is in
// attempt order whatever that order was, so two rounds on the same fold
// write the same facts in the same order.
func TestOverdueAttemptsAreReleasedInAttemptOrder(t *testing.T) {
	hosts := make([]events.Payload, 0, 4)
	for _, h := range []string{"h-a", "h-b", "h-c", "h-d"} {
		p := host(h)
		p.PhysicalCap, p.Pools["linux"] = 10, events.PoolSlots{Labels: linux, Slots: 10}
		hosts = append(hosts, p)
	}
	l := given().at(0, hosts...)
	for id := int64(1); id <= 30; id++ {
		l = l.at(0, placed(id, []string{"h-a", "h-b", "h-c", "h-d"}[id%4])...)
	}

	for round := 0; round < 5; round++ {
		plan := l.decide(params.ProvisionTimeout+2*time.Second, nil)
		if len(plan.Release) != 30 || len(plan.Teardown) != 30 {
			t.Fatalf("round %d: %d releases and %d teardowns, want 30 of each", round, len(plan.Release), len(plan.Teardown))
		}
		for i := 1; i < 30; i++ {
			if plan.Release[i-1].Attempt >= plan.Release[i].Attempt || plan.Teardown[i-1].Attempt >= plan.Teardown[i].Attempt {
				t.Fatalf("round %d: releases %v out of attempt order at %d", round, attempts(plan.Release), i)
			}
		}
	}
}

func attempts(rs []events.SlotReleased) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Attempt
	}
	return out
}

// Jobs a booked runner that has not taken a job yet will serve are not
// waiting for a slot: the report counts only the rest.
func TestABookedRunnerLeavesItsJobOutOfTheWaitingReport(t *testing.T) {
	after := params.DemandWaitingAfter
	l := given().at(0, host("h-a")).
		at(0, &events.JobQueued{JobRef: job(1)}, &events.JobQueued{JobRef: job(2)}).
		at(time.Second, reserve(1, "h-a"), &events.AttemptPlaced{AttemptRef: aref(1, "h-a"), JobID: 1})

	plan := l.decide(after+time.Minute, nil)
	if len(plan.Demand) != 1 || plan.Demand[0].Jobs != 1 {
		t.Fatalf("demand %+v, want one report of 1 job (the other has a runner booked)", plan.Demand)
	}
}
