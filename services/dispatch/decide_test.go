package dispatch_test

import (
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/dispatch"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
)

var t0 = time.Date(2025, 3, 1, 9, 0, 0, 0, time.UTC)

var params = dispatch.Params{MaxAttempts: 3}

// log is a history being written: fact n is stored at seq n, t0 + n seconds.
type log struct {
	t *testing.T
	f *events.Fleet
	n uint64
}

func given(t *testing.T) *log { return &log{t: t, f: events.NewFleet()} }

func (l *log) add(ps ...events.Payload) *log {
	for _, p := range ps {
		l.n++
		e := events.New("test", t0.Add(time.Duration(l.n)*time.Second), p)
		e.Seq = l.n
		testkit.ApplyGranted(l.f, e)
	}
	return l
}

// apply appends a plan's facts as the dispatcher would: releases, teardowns,
// unschedulable jobs, then bookings.
func (l *log) apply(p dispatch.Plan) *log {
	for i := range p.Release {
		l.add(&p.Release[i])
	}
	for i := range p.Teardown {
		l.add(&p.Teardown[i])
	}
	for i := range p.Unschedulable {
		l.add(&p.Unschedulable[i])
	}
	for i := range p.Conflicts {
		l.add(&p.Conflicts[i])
	}
	for i := range p.Reserve {
		l.add(&p.Reserve[i])
	}
	return l
}

func (l *log) decide() dispatch.Plan {
	l.t.Helper()
	if vs := l.f.Check(); len(vs) > 0 {
		l.t.Fatalf("the history breaks fleet invariants: %v", vs)
	}
	return dispatch.Decide(l.f, params)
}

var linux = []string{"linux", "self-hosted"}

func host(name string, slots, physical int) *events.HostOnline {
	return &events.HostOnline{Host: name, Boot: "boot-1", PhysicalCap: physical, CurveKey: "X" + name, Backend: "exec",
		Pools: map[string]events.PoolSlots{"linux": {Labels: linux, Slots: slots}}}
}

func ref(job int64, labels ...string) events.JobRef {
	if labels == nil {
		labels = []string{"self-hosted", "linux"}
	}
	return events.JobRef{JobID: job, RunID: 100, Labels: labels}
}

func queued(job int64, labels ...string) *events.JobQueued {
	return &events.JobQueued{JobRef: ref(job, labels...)}
}

func inProgress(job int64, runner string) *events.JobInProgress {
	return &events.JobInProgress{JobRef: ref(job), RunnerName: runner}
}

func completed(job int64, runner, conclusion string) *events.JobCompleted {
	return &events.JobCompleted{JobRef: ref(job), RunnerName: runner, Conclusion: conclusion}
}

func attempt(job int64, n int) string { return events.AttemptID(job, n) }

func aref(job int64, n int, hostName string) events.AttemptRef {
	return events.AttemptRef{Attempt: attempt(job, n), Pool: "linux", Host: hostName}
}

func reserved(job int64, n int, hostName string) *events.SlotReserved {
	return &events.SlotReserved{Pool: "linux", Host: hostName, Attempt: attempt(job, n), JobID: job, N: n, Labels: linux}
}

func released(job int64, n int, hostName, reason string) *events.SlotReleased {
	return &events.SlotReleased{Pool: "linux", Host: hostName, Attempt: attempt(job, n), Reason: reason, JobID: job}
}

// booted: attempt n of job is booked, placed and its runner is up (unbound).
func booted(job int64, n int, hostName string) []events.Payload {
	r := aref(job, n, hostName)
	return []events.Payload{reserved(job, n, hostName), &events.AttemptPlaced{AttemptRef: r, JobID: job, Labels: linux},
		&events.AttemptProvisioning{AttemptRef: r}, &events.AttemptRunnerStarted{AttemptRef: r}}
}

// running: job is queued, booked on host, and its runner took it.
func running(job int64, hostName string) []events.Payload {
	return append(append([]events.Payload{queued(job)}, booked(job, hostName)...), inProgress(job, attempt(job, 1)))
}

func booked(job int64, hostName string) []events.Payload { return booted(job, 1, hostName) }

// done: job ran on attempt 1 and everything about it is over.
func done(job int64, hostName, conclusion string) []events.Payload {
	r := aref(job, 1, hostName)
	return append(running(job, hostName), completed(job, attempt(job, 1), conclusion),
		released(job, 1, hostName, events.ReleaseCompleted),
		&events.AttemptTeardownRequested{AttemptRef: r, Reason: events.ReleaseCompleted},
		&events.AttemptStopped{AttemptRef: r})
}

func attempts(rs []events.SlotReleased) map[string]string {
	out := map[string]string{}
	for _, r := range rs {
		out[r.Attempt] = r.Reason
	}
	return out
}

func TestQueuedJobBooksOneSlotOnTheHostWithMostFreeSlots(t *testing.T) {
	l := given(t).add(host("h-a", 1, 1), host("h-b", 4, 4), host("h-c", 2, 2))
	for job := int64(1); job <= 3; job++ { // h-b offers most slots but has only one free
		l.add(running(job, "h-b")...)
	}
	l.add(queued(42))

	plan := l.decide()

	want := []events.SlotReserved{{Pool: "linux", Host: "h-c", Attempt: "berth-42-1", JobID: 42, N: 1, Labels: linux}}
	if !reflect.DeepEqual(plan.Reserve, want) {
		t.Fatalf("reserve %+v, want %+v", plan.Reserve, want)
	}
	if len(plan.Release)+len(plan.Teardown)+len(plan.Unschedulable) != 0 {
		t.Fatalf("a booking only: %+v", plan)
	}
}

func TestJobWhoseLabelsMatchNoPoolGetsNothing(t *testing.T) {
	for _, labels := range [][]string{{"self-hosted", "gpu"}, {"ubuntu-latest"}, {"self-hosted", "linux", "arm64"}} {
		plan := given(t).add(host("h-a", 2, 2), queued(7, labels...)).decide()
		if !reflect.DeepEqual(plan, dispatch.Plan{}) {
			t.Errorf("labels %v: plan %+v, want nothing", labels, plan)
		}
	}
}

func TestFullPoolKeepsTheJobAsDemandUntilASlotIsReleased(t *testing.T) {
	l := given(t).add(host("h-a", 1, 2)).add(running(1, "h-a")...).add(queued(2))

	if plan := l.decide(); len(plan.Reserve) != 0 {
		t.Fatalf("held == slots, yet booked %+v", plan.Reserve)
	}
	if !l.f.Jobs[2].Demand() {
		t.Fatal("job 2 is no longer demand")
	}

	l.add(completed(1, attempt(1, 1), "success"))
	plan := l.decide()
	if got := attempts(plan.Release); got[attempt(1, 1)] != events.ReleaseCompleted || len(plan.Reserve) != 0 {
		t.Fatalf("completion: release %v reserve %+v, want release of berth-1-1 and no booking yet", got, plan.Reserve)
	}
	l.apply(plan)
	if plan := l.decide(); len(plan.Reserve) != 1 || plan.Reserve[0].Attempt != attempt(2, 1) {
		t.Fatalf("after the release: reserve %+v, want berth-2-1", plan.Reserve)
	}
}

// BL-01 / BL-28: stops that never return leave VMs alive; they hold the
// host's physical capacity although their slots went back at completion.
func TestAbandonedVMsHoldPhysicalCapacityDespiteFreeSlots(t *testing.T) {
	given := func() *log {
		l := given(t).add(host("mac-1", 2, 2))
		for job := int64(1); job <= 2; job++ {
			r := aref(job, 1, "mac-1")
			l.add(running(job, "mac-1")...).add(completed(job, attempt(job, 1), "failure"),
				released(job, 1, "mac-1", events.ReleaseCompleted),
				&events.AttemptTeardownRequested{AttemptRef: r, Reason: events.ReleaseCompleted},
				&events.AttemptAbandoned{AttemptRef: r, Step: "stop", After: time.Minute})
		}
		return l.add(queued(3))
	}

	l := given()
	if plan := l.decide(); len(plan.Reserve)+len(plan.Release)+len(plan.Teardown) != 0 {
		t.Fatalf("2 of 2 VMs alive: plan %+v, want no booking and nothing released twice", plan)
	}
	if !l.f.Jobs[3].Demand() {
		t.Fatal("job 3 must stay demand")
	}

	l.add(host("mac-2", 1, 1))
	if plan := l.decide(); len(plan.Reserve) != 1 || plan.Reserve[0].Host != "mac-2" {
		t.Fatalf("mac-2 online: reserve %+v, want job 3 on mac-2", plan.Reserve)
	}

	l = given().add(&events.AttemptStopped{AttemptRef: aref(1, 1, "mac-1"), Late: true})
	if plan := l.decide(); len(plan.Reserve) != 1 || plan.Reserve[0].Host != "mac-1" {
		t.Fatalf("late stop of berth-1-1: reserve %+v, want job 3 on mac-1", plan.Reserve)
	}
}

func TestOnlyAcceptingHostsWithACurveKeyGetBookings(t *testing.T) {
	change := events.HostChange{Host: "h-a", Reason: "test", At: t0}
	keyless := host("h-a", 2, 2)
	keyless.CurveKey = ""
	cases := []struct {
		name string
		fact events.Payload
		want int
	}{
		{"accepting", &events.HostUncordoned{HostChange: change}, 1},
		{"cordoned", &events.HostCordoned{HostChange: change}, 0},
		{"draining", &events.HostDraining{HostChange: change}, 0},
		{"lost", &events.HostLost{HostChange: change}, 0},
		{"no curve key", keyless, 0},
	}
	for _, c := range cases {
		l := given(t).add(host("h-a", 2, 2), queued(1), c.fact)
		if plan := l.decide(); len(plan.Reserve) != c.want {
			t.Errorf("%s: reserve %+v, want %d booking(s)", c.name, plan.Reserve, c.want)
		}
	}
}

func TestCompletionReleasesInTheSameReactionAndTeardownFollows(t *testing.T) {
	l := given(t).add(host("h-a", 2, 2)).add(running(7, "h-a")...).add(completed(7, attempt(7, 1), "success"))

	plan := l.decide()
	want := []events.SlotReleased{*released(7, 1, "h-a", events.ReleaseCompleted)}
	if !reflect.DeepEqual(plan.Release, want) || len(plan.Teardown) != 0 {
		t.Fatalf("release %+v teardown %+v, want %+v and no teardown before the release is folded", plan.Release, plan.Teardown, want)
	}

	l.apply(plan)
	plan = l.decide()
	wantT := []events.AttemptTeardownRequested{{AttemptRef: aref(7, 1, "h-a"), Reason: events.ReleaseCompleted}}
	if !reflect.DeepEqual(plan.Teardown, wantT) || len(plan.Release) != 0 {
		t.Fatalf("after release: teardown %+v release %+v, want %+v only", plan.Teardown, plan.Release, wantT)
	}

	if plan := l.apply(plan).decide(); !reflect.DeepEqual(plan, dispatch.Plan{}) {
		t.Fatalf("after teardown: %+v, want nothing", plan)
	}
}

// Law 8: GitHub gave job 2 the runner booked for job 1.
func TestRunnerTakenByAnotherJobBooksAFreshAttemptForTheFirst(t *testing.T) {
	l := given(t).add(host("h-a", 3, 3), queued(1)).add(booked(1, "h-a")...).add(queued(2), inProgress(2, attempt(1, 1)))

	plan := l.decide()
	if len(plan.Reserve) != 1 || plan.Reserve[0].Attempt != "berth-1-2" || plan.Reserve[0].N != 2 || plan.Reserve[0].JobID != 1 {
		t.Fatalf("reserve %+v, want berth-1-2 (N=2) for job 1, nothing for job 2", plan.Reserve)
	}
	if len(plan.Release) != 0 {
		t.Fatalf("release %+v: berth-1-1 runs job 2", plan.Release)
	}

	l.apply(plan).add(completed(2, attempt(1, 1), "success"))
	plan = l.decide()
	if got := attempts(plan.Release); len(got) != 1 || got["berth-1-1"] != events.ReleaseCompleted {
		t.Fatalf("job 2 completed on berth-1-1: release %v, want berth-1-1 only", got)
	}
}

func TestSwappedRunnersReleaseTheAttemptThatRanTheCompletedJob(t *testing.T) {
	l := given(t).add(host("h-a", 2, 2), queued(1), queued(2)).add(booked(1, "h-a")...).add(booked(2, "h-a")...)
	l.add(inProgress(1, attempt(2, 1)), inProgress(2, attempt(1, 1)), completed(1, attempt(2, 1), "success"))

	plan := l.decide()
	if got := attempts(plan.Release); len(got) != 1 || got["berth-2-1"] != events.ReleaseCompleted {
		t.Fatalf("job 1 ran on berth-2-1: release %v, want berth-2-1 only", got)
	}
	if len(plan.Reserve) != 0 {
		t.Fatalf("no job is demand: reserve %+v", plan.Reserve)
	}
}

// A job cancelled before any runner took it leaves one runner too many; the
// least advanced goes back (runners are interchangeable) and is not minted.
func TestCancelledBeforeRunnerReleasesTheSurplusAttempt(t *testing.T) {
	l := given(t).add(host("h-a", 2, 2), queued(5), queued(6)).add(booted(5, 1, "h-a")...).add(reserved(6, 1, "h-a"))
	l.add(completed(5, "", "cancelled"))

	plan := l.decide()
	if got := attempts(plan.Release); len(got) != 1 || got["berth-6-1"] != events.ReleaseSurplus {
		t.Fatalf("release %v, want berth-6-1 (not placed yet) as surplus", got)
	}
	for _, a := range plan.Mint {
		if a.ID == "berth-6-1" {
			t.Fatal("berth-6-1 is released in this plan, yet listed for a JIT config (law 1)")
		}
	}
	if len(plan.Reserve) != 0 {
		t.Fatalf("reserve %+v, want none: berth-5-1 serves job 6", plan.Reserve)
	}
}

// BL-08: re-running failed jobs re-sends completions of jobs already done.
func TestResentCompletionsReleaseNothingTwiceAndKeepNewDemand(t *testing.T) {
	l := given(t).add(host("h-a", 6, 6))
	for job := int64(1); job <= 6; job++ {
		l.add(done(job, "h-a", map[bool]string{true: "failure", false: "success"}[job == 6])...)
	}
	resend := func() {
		for job := int64(1); job <= 5; job++ {
			c := completed(job, attempt(job, 1), "success")
			c.Delivery = "resent-" + strconv.FormatInt(job, 10) + "-" + strconv.FormatUint(l.n, 10)
			l.add(c)
		}
	}
	l.add(queued(61))
	resend()

	plan := l.decide()
	if len(plan.Release)+len(plan.Teardown) != 0 || len(plan.Reserve) != 1 || plan.Reserve[0].JobID != 61 {
		t.Fatalf("plan %+v, want exactly one booking, for job 61, and no release", plan)
	}

	l.apply(plan)
	resend()
	plan = l.decide()
	if len(plan.Release)+len(plan.Reserve) != 0 {
		t.Fatalf("re-sent again: plan %+v, want job 61's booking kept and nothing released", plan)
	}
	if len(plan.Mint) != 1 || plan.Mint[0].ID != "berth-61-1" {
		t.Fatalf("mint %v, want berth-61-1", plan.Mint)
	}
}

func TestFailedAttemptIsReleasedCreateFailed(t *testing.T) {
	r := aref(3, 1, "h-a")
	l := given(t).add(host("h-a", 2, 2), queued(3), reserved(3, 1, "h-a"), &events.AttemptPlaced{AttemptRef: r, JobID: 3},
		&events.AttemptProvisioning{AttemptRef: r}, &events.AttemptFailed{AttemptRef: r, Step: "create", Error: "boom"})

	plan := l.decide()
	if got := attempts(plan.Release); len(got) != 1 || got["berth-3-1"] != events.ReleaseCreateFailed {
		t.Fatalf("release %v, want berth-3-1 create_failed", got)
	}
	if len(plan.Reserve) != 1 || plan.Reserve[0].Attempt != "berth-3-2" {
		t.Fatalf("reserve %+v, want a fresh attempt berth-3-2", plan.Reserve)
	}
}

func TestJobIsUnschedulableAfterMaxAttemptsFailedPlacements(t *testing.T) {
	given := func(failed int) *log {
		l := given(t).add(host("h-a", 2, 2), queued(4))
		for n := 1; n <= failed; n++ {
			l.add(reserved(4, n, "h-a"), released(4, n, "h-a", events.ReleaseMintFailed))
		}
		return l
	}

	plan := given(params.MaxAttempts - 1).decide()
	if len(plan.Unschedulable) != 0 || len(plan.Reserve) != 1 || plan.Reserve[0].N != params.MaxAttempts {
		t.Fatalf("%d failures: plan %+v, want attempt %d booked", params.MaxAttempts-1, plan, params.MaxAttempts)
	}

	plan = given(params.MaxAttempts).decide()
	if len(plan.Reserve) != 0 || len(plan.Unschedulable) != 1 || plan.Unschedulable[0].JobID != 4 ||
		plan.Unschedulable[0].Attempts != params.MaxAttempts || plan.Unschedulable[0].Reason == "" {
		t.Fatalf("%d failures: plan %+v, want job 4 unschedulable with a reason and no booking", params.MaxAttempts, plan)
	}
}

// busy is a fleet with work of every kind for Decide.
func busy(t *testing.T) *log {
	l := given(t).add(host("h-a", 2, 3), host("h-b", 2, 3), host("h-c", 1, 1))
	l.add(running(1, "h-a")...).add(completed(1, attempt(1, 1), "success"))
	l.add(queued(2)).add(booked(2, "h-b")...).add(completed(2, "", "cancelled"))
	for job := int64(10); job < 16; job++ {
		l.add(queued(job))
	}
	return l
}

func TestDecideIsDeterministic(t *testing.T) {
	l := busy(t)
	first := l.decide()
	if len(first.Reserve) == 0 || len(first.Release) == 0 {
		t.Fatalf("the fixture should book and release: %+v", first)
	}
	for i := 0; i < 50; i++ {
		if again := dispatch.Decide(l.f, params); !reflect.DeepEqual(again, first) {
			t.Fatalf("decide #%d differs:\n%+v\nfirst:\n%+v", i+2, again, first)
		}
	}
}

func TestAppliedPlanIsNeverBookedTwice(t *testing.T) {
	l := busy(t)
	booked := map[int64]int{}
	for round := 0; round < 10; round++ {
		plan := l.decide()
		for _, r := range plan.Reserve {
			if booked[r.JobID]++; booked[r.JobID] > 1 {
				t.Fatalf("round %d: job %d booked a second time (%s)", round, r.JobID, r.Attempt)
			}
		}
		if len(plan.Reserve)+len(plan.Release)+len(plan.Teardown) == 0 {
			// 5 slots: job 2's runner (cancelled, unbound) serves one of
			// jobs 10..15, so 4 fresh bookings fill the pool.
			if len(booked) != 4 || l.f.Pools["linux"].Held != 5 {
				t.Fatalf("quiet after booking %v with %d held, want 4 jobs booked and 5 held", booked, l.f.Pools["linux"].Held)
			}
			return
		}
		l.apply(plan)
	}
	t.Fatal("Decide did not settle within 10 rounds")
}

// Given 20 queued jobs, 20 free slots and a cap of 8 bookings waiting for
// their JIT config, when the dispatcher decides, then it books the 8
// oldest jobs and leaves the rest as demand; when 5 of those are placed,
// then the next round books the 5 next oldest. (10,000 jobs at once on 500
// hosts booked every slot at once; the JIT-config calls could not follow,
// and bookings expired at the provisioning deadline in the queue.)
func TestBookingsWaitingForAJITConfigAreCapped(t *testing.T) {
	l := given(t).add(host("h-a", 20, 20))
	for job := int64(1); job <= 20; job++ {
		l.add(queued(job))
	}
	capped := params
	capped.MaxUnminted = 8
	jobsOf := func(rs []events.SlotReserved) []int64 {
		var out []int64
		for _, r := range rs {
			out = append(out, r.JobID)
		}
		slices.Sort(out)
		return out
	}

	plan := dispatch.Decide(l.f, capped)
	if got, want := jobsOf(plan.Reserve), []int64{1, 2, 3, 4, 5, 6, 7, 8}; !slices.Equal(got, want) {
		t.Fatalf("booked jobs %v, want the 8 oldest %v", got, want)
	}
	if len(plan.Mint) != 0 {
		t.Fatalf("minting %d attempts before any booking is stored", len(plan.Mint))
	}
	l.apply(plan)
	if plan := dispatch.Decide(l.f, capped); len(plan.Reserve) != 0 || len(plan.Mint) != 8 {
		t.Fatalf("with 8 bookings unminted: %d more booked, %d to mint; want 0 and 8", len(plan.Reserve), len(plan.Mint))
	}
	for job := int64(1); job <= 5; job++ {
		l.add(&events.AttemptPlaced{AttemptRef: aref(job, 1, "h-a"), JobID: job, Labels: linux})
	}
	plan = dispatch.Decide(l.f, capped)
	if got, want := jobsOf(plan.Reserve), []int64{9, 10, 11, 12, 13}; !slices.Equal(got, want) {
		t.Fatalf("after 5 placements booked %v, want %v", got, want)
	}
	// And without a cap every free slot is booked at once.
	if plan := dispatch.Decide(l.f, params); len(plan.Reserve) != 12 {
		t.Fatalf("uncapped: %d booked, want the 12 waiting jobs", len(plan.Reserve))
	}
}

// deliver feeds e to d as its loop would, and the operator's grant of what
// it claims if it is a HostOnline (testkit.GrantOf).
func deliver(d *dispatch.Dispatcher, e events.Event) {
	d.Apply(eventlog.Delivered{Event: e})
	if g, ok := testkit.GrantOf(e); ok {
		d.Apply(eventlog.Delivered{Event: g})
	}
}
