package dispatch_test

import (
	"slices"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/dispatch"
	"github.com/berth-ci/berth/services/testkit"
)

// warmWorld runs Decide against a fold, acting as the dispatcher's act
// shell and the agents would, so a test can follow warm VMs through their
// lives. Facts are stamped at the fake clock now (a millisecond apart);
// decisions are made at now.
type warmWorld struct {
	*log
	p       dispatch.Params
	now     time.Time
	created []string // attempts whose VM a create step made, in order
}

func warmGiven(t *testing.T, warm dispatch.WarmPool, hosts ...*events.HostOnline) *warmWorld {
	w := &warmWorld{log: given(t), p: params, now: t0}
	w.p.Warm = map[string]dispatch.WarmPool{"linux": warm}
	for _, h := range hosts {
		h.Assign = true
		w.add(h)
	}
	return w
}

func (w *warmWorld) add(ps ...events.Payload) *warmWorld {
	for _, p := range ps {
		w.n++
		e := events.New("test", w.now.Add(time.Duration(w.n)*time.Millisecond), p)
		e.Seq = w.n
		testkit.ApplyGranted(w.f, e)
	}
	return w
}

// apply appends a plan's releases, teardowns and bookings.
func (w *warmWorld) apply(plan dispatch.Plan) {
	for i := range plan.Release {
		w.add(&plan.Release[i])
	}
	for i := range plan.Teardown {
		w.add(&plan.Teardown[i])
	}
	for i := range plan.Reserve {
		w.add(&plan.Reserve[i])
	}
}

func (w *warmWorld) decide() dispatch.Plan {
	w.t.Helper()
	if vs := w.f.Check(); len(vs) > 0 {
		w.t.Fatalf("the history breaks fleet invariants: %v", vs)
	}
	p := w.p
	p.Now = w.now
	return dispatch.Decide(w.f, p)
}

// react applies plans until nothing moves: releases, claims, bookings and
// placements as the dispatcher appends them; mints as placements (cold) or
// assignments (warm); agents booting VMs (warm ones to ready, cold ones to a
// started runner), starting a warm VM's runner on assignment, and stopping
// torn-down VMs. bootWedged names attempts whose create never returns.
func (w *warmWorld) react(bootWedged ...string) {
	w.t.Helper()
	for round := 0; round < 30; round++ {
		plan := w.decide()
		moved := len(plan.Release)+len(plan.Teardown)+len(plan.Claim)+len(plan.Reserve)+len(plan.Place)+len(plan.Mint) > 0
		w.apply(plan)
		for i := range plan.Claim {
			w.add(&plan.Claim[i])
		}
		for i := range plan.Place {
			w.add(&plan.Place[i])
		}
		for _, a := range plan.Mint {
			r := events.AttemptRef{Attempt: a.ID, Pool: a.Pool, Host: a.Host}
			if a.Warm {
				w.add(&events.AttemptAssigned{AttemptRef: r, JobID: a.JobID, RunnerID: 7}, &events.AttemptRunnerStarted{AttemptRef: r})
			} else {
				w.add(&events.AttemptPlaced{AttemptRef: r, JobID: a.JobID, Labels: a.Labels, RunnerID: 7})
			}
		}
		for _, a := range w.f.Attempts {
			r := events.AttemptRef{Attempt: a.ID, Pool: a.Pool, Host: a.Host}
			switch {
			case a.Placed && !a.Provisioning && !a.TeardownReq:
				w.created = append(w.created, a.ID)
				w.add(&events.AttemptProvisioning{AttemptRef: r})
				switch {
				case slices.Contains(bootWedged, a.ID):
				case a.Warm:
					w.add(&events.AttemptReady{AttemptRef: r})
				default:
					w.add(&events.AttemptRunnerStarted{AttemptRef: r})
				}
				moved = true
			case a.TeardownReq && !a.Stopped:
				w.add(&events.AttemptStopped{AttemptRef: r})
				moved = true
			}
		}
		if !moved {
			return
		}
	}
	w.t.Fatal("the fleet did not settle in 30 rounds")
}

// idle lists the pool's idle warm VMs.
func (w *warmWorld) idle() []string {
	var out []string
	for _, a := range w.f.Attempts {
		if a.Idle() {
			out = append(out, a.ID)
		}
	}
	slices.Sort(out)
	return out
}

// run has a runner take job and GitHub complete it.
func (w *warmWorld) run(job int64) string {
	w.t.Helper()
	for _, a := range w.f.Attempts {
		if a.JobID == job && a.RunnerStarted && a.Held() && w.f.BoundJob(a.ID) == 0 {
			w.add(inProgress(job, a.ID), completed(job, a.ID, "success"))
			return a.ID
		}
	}
	w.t.Fatalf("no runner started for job %d", job)
	return ""
}

// Given a pool with min_idle 2 on a host that can keep warm VMs, when the
// fleet settles, then two warm VMs are booked (in the pool's ledger, holding
// slots), booted and idle, and nothing is minted for them. When a job
// arrives, it claims an idle VM (no create step in its path: the VM was
// created before the job), the claimed VM is handed its JIT config, and the
// pool refills to 2. The job's completion releases the slot and tears the
// VM down, as for any attempt.
func TestAJobRunsOnAWarmVMAndThePoolRefills(t *testing.T) {
	w := warmGiven(t, dispatch.WarmPool{MinIdle: 2}, host("h-a", 4, 4))
	plan := w.decide()
	if len(plan.Reserve) != 2 || !plan.Reserve[0].Warm || plan.Reserve[0].JobID != 0 || len(plan.Mint) != 0 {
		t.Fatalf("bookings %+v, mint %v: want 2 warm bookings without a job and nothing minted", plan.Reserve, plan.Mint)
	}
	w.react()
	if got := w.idle(); len(got) != 2 {
		t.Fatalf("idle warm VMs %v, want 2", got)
	}
	if h := w.f.Pools["linux"].Held; h != 2 {
		t.Fatalf("held %d, want 2: a warm VM holds its slot", h)
	}
	before := slices.Clone(w.created)

	w.add(queued(1))
	plan = w.decide()
	if len(plan.Claim) != 1 || plan.Claim[0].JobID != 1 || !slices.Contains(before, plan.Claim[0].Attempt) {
		t.Fatalf("claims %+v: want job 1 to claim one of the idle VMs %v", plan.Claim, before)
	}
	for _, r := range plan.Reserve {
		if !r.Warm {
			t.Fatalf("a cold booking %+v while an idle warm VM exists", r)
		}
	}
	w.react()
	served := w.run(1)
	if slices.Contains(w.created[len(before):], served) {
		t.Fatalf("job 1 ran on %s, created after the job arrived (created %v); want a VM created before", served, w.created)
	}
	if !slices.Contains(before, served) {
		t.Fatalf("job 1 ran on %s, not on one of the warm VMs %v", served, before)
	}
	w.react()
	if a := w.f.Attempts[served]; a.Held() || !a.TeardownReq {
		t.Fatalf("after job 1 completed: %s held %v, teardown %v; want released and torn down", served, a.Held(), a.TeardownReq)
	}
	if got := w.idle(); len(got) != 2 {
		t.Fatalf("after the claim, idle warm VMs %v; want the pool refilled to 2", got)
	}
}

// Given min_idle 2 on a host of 4 slots, when 5 jobs arrive at once, then
// the first two claim the warm VMs, the next two get cold bookings in the
// slots left, the fifth waits, capacity is never exceeded, and every job is
// served in the end.
func TestABurstBeyondTheWarmTargetGetsColdVMsWithinCapacity(t *testing.T) {
	w := warmGiven(t, dispatch.WarmPool{MinIdle: 2}, host("h-a", 4, 4))
	w.react()
	for j := int64(1); j <= 5; j++ {
		w.add(queued(j))
	}
	plan := w.decide()
	var cold int
	for _, r := range plan.Reserve {
		if !r.Warm {
			cold++
		}
	}
	if len(plan.Claim) != 2 || cold != 2 {
		t.Fatalf("claims %d, cold bookings %d; want the 2 warm VMs claimed and 2 cold bookings in the 2 free slots", len(plan.Claim), cold)
	}
	served := map[int64]string{}
	for round := 0; round < 10 && len(served) < 5; round++ {
		w.react()
		if held, c := w.f.Pools["linux"].Held, w.f.Capacity("linux"); held > c {
			t.Fatalf("held %d > capacity %d", held, c)
		}
		for j := int64(1); j <= 5; j++ {
			if _, done := served[j]; !done && w.f.Jobs[j].Status == events.StatusQueued {
				for _, a := range w.f.Attempts {
					if a.JobID == j && a.RunnerStarted && a.Held() {
						served[j] = w.run(j)
						break
					}
				}
			}
		}
	}
	if len(served) != 5 {
		t.Fatalf("served %v, want all 5 jobs", served)
	}
	var warm int
	for _, a := range served {
		if w.f.Attempts[a].Warm {
			warm++
		}
	}
	if warm < 2 {
		t.Fatalf("%d jobs ran on warm VMs, want at least the first 2", warm)
	}
}

// Given a schedule (weekdays 08:00–12:00 in Berlin: 3 warm VMs; otherwise
// 1), on a fake clock: before the window the pool keeps 1; when it opens,
// 3; while a job holds one of them, the window closes and the target falls
// to 1: idle surplus is released oldest first, and the claimed VM is not
// stopped.
func TestTheWarmTargetFollowsItsSchedule(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skipf("no time zone data: %v", err)
	}
	monday := time.Date(2025, 3, 3, 7, 59, 0, 0, berlin) // a Monday
	w := warmGiven(t, dispatch.WarmPool{MinIdle: 1, MaxIdleAge: 8 * time.Hour, Location: berlin, Schedule: []dispatch.WarmWindow{
		{Days: []time.Weekday{time.Monday, time.Tuesday, time.Wednesday, time.Thursday, time.Friday}, From: 8 * 60, To: 12 * 60, MinIdle: 3},
	}}, host("h-a", 6, 6))
	w.now = monday
	w.react()
	if got := w.idle(); len(got) != 1 {
		t.Fatalf("07:59: idle %v, want 1", got)
	}
	w.now = monday.Add(time.Minute) // 08:00
	w.react()
	if got := w.idle(); len(got) != 3 {
		t.Fatalf("08:00: idle %v, want 3", got)
	}
	w.add(queued(1))
	w.react() // job 1 claims a VM; the pool refills to 3 idle
	var claimed string
	for _, a := range w.f.Attempts {
		if a.Claimed {
			claimed = a.ID
		}
	}
	idleBefore := w.idle()
	if claimed == "" || len(idleBefore) != 3 {
		t.Fatalf("after job 1: claimed %q, idle %v; want one claimed and 3 idle", claimed, idleBefore)
	}
	w.now = monday.Add(4*time.Hour + time.Minute) // 12:00
	plan := w.decide()
	var gone []string
	for _, r := range plan.Release {
		if r.Reason != events.ReleaseWarmSurplus {
			t.Fatalf("release %+v at 12:00, want only warm surplus", r)
		}
		gone = append(gone, r.Attempt)
	}
	if len(gone) != 2 || slices.Contains(gone, claimed) {
		t.Fatalf("12:00 releases %v; want 2 idle surplus VMs, never the claimed %s", gone, claimed)
	}
	oldest := slices.Clone(idleBefore)
	slices.SortFunc(oldest, func(a, b string) int { return w.f.Attempts[a].ReservedAt.Compare(w.f.Attempts[b].ReservedAt) })
	if slices.Sort(gone); !slices.Equal(gone, func() []string { s := slices.Clone(oldest[:2]); slices.Sort(s); return s }()) {
		t.Fatalf("released %v; want the 2 oldest idle ones of %v", gone, oldest)
	}
	w.react()
	if a := w.f.Attempts[claimed]; !a.Held() || a.TeardownReq {
		t.Fatalf("the claimed VM %s was stopped by the scale-down", claimed)
	}
	if got := w.idle(); len(got) != 1 {
		t.Fatalf("after 12:00: idle %v, want 1", got)
	}
}

// An idle VM older than the maximum idle age is recycled: released and
// torn down, and a fresh one booked in its place.
func TestAnIdleWarmVMPastItsMaxAgeIsRecycled(t *testing.T) {
	w := warmGiven(t, dispatch.WarmPool{MinIdle: 1, MaxIdleAge: 10 * time.Minute}, host("h-a", 4, 4))
	w.react()
	first := w.idle()
	w.now = w.now.Add(11 * time.Minute)
	plan := w.decide()
	if len(plan.Release) != 1 || plan.Release[0].Attempt != first[0] || plan.Release[0].Reason != events.ReleaseWarmRecycled {
		t.Fatalf("releases %+v; want %s recycled", plan.Release, first[0])
	}
	w.react()
	if got := w.idle(); len(got) != 1 || got[0] == first[0] {
		t.Fatalf("idle %v; want one fresh VM in place of %s", got, first[0])
	}
}

// A host whose backend cannot assign (EC2, vz) gets no warm VM, and a job
// there is booked cold.
func TestAHostThatCannotAssignKeepsNoWarmVM(t *testing.T) {
	w := warmGiven(t, dispatch.WarmPool{MinIdle: 2})
	w.add(host("h-a", 4, 4)) // Assign false
	w.react()
	if len(w.f.Attempts) != 0 {
		t.Fatalf("attempts %v on a host that cannot assign", w.idle())
	}
	w.add(queued(1))
	plan := w.decide()
	if len(plan.Reserve) != 1 || plan.Reserve[0].Warm || plan.Reserve[0].JobID != 1 {
		t.Fatalf("bookings %+v; want one cold booking for job 1", plan.Reserve)
	}
}

// A warm VM whose boot wedges: the agent abandons its create step at its
// deadline (law 3); the slot goes back at once (the VM still counts on the
// host until seen stopped), no job's attempts are spent, and the pool books
// another warm VM in its place.
func TestAWedgedWarmBootDoesNotPinItsSlot(t *testing.T) {
	w := warmGiven(t, dispatch.WarmPool{MinIdle: 1}, host("h-a", 2, 4))
	wedged := events.WarmAttemptID("linux", 1)
	w.react(wedged)
	a := w.f.Attempts[wedged]
	if a == nil || !a.Held() || a.Ready {
		t.Fatalf("%s: %+v; want booked and booting", wedged, a)
	}
	w.add(&events.AttemptAbandoned{AttemptRef: events.AttemptRef{Attempt: wedged, Pool: "linux", Host: "h-a"}, Step: "create", After: time.Minute})
	plan := w.decide()
	if len(plan.Release) != 1 || plan.Release[0].Attempt != wedged {
		t.Fatalf("releases %+v; want the wedged VM's slot back", plan.Release)
	}
	w.react(wedged)
	if a.Held() {
		t.Fatal("the wedged VM still holds its slot")
	}
	if got := w.idle(); len(got) != 1 || got[0] == wedged {
		t.Fatalf("idle %v; want a fresh warm VM in the wedged one's place", got)
	}
}

// Given a pool target of 2 with a floor of 1 on h-b, on two hosts of which
// h-a has more free slots (so the pool-wide refill prefers it), then one of
// the 2 warm VMs is on h-b; and when the target falls to 0 the floor keeps
// h-b's VM while the other is released.
func TestAPerHostFloorKeepsWarmVMsOnThatHost(t *testing.T) {
	w := warmGiven(t, dispatch.WarmPool{MinIdle: 2, Hosts: map[string]int{"h-b": 1}}, host("h-a", 8, 8), host("h-b", 2, 2))
	w.react()
	on := map[string]int{}
	for _, id := range w.idle() {
		on[w.f.Attempts[id].Host]++
	}
	if len(w.idle()) != 2 || on["h-b"] != 1 {
		t.Fatalf("idle warm VMs per host %v, want 2 in all with 1 on h-b", on)
	}
	w.p.Warm = map[string]dispatch.WarmPool{"linux": {MinIdle: 0, Hosts: map[string]int{"h-b": 1}}}
	w.react()
	left := w.idle()
	if len(left) != 1 || w.f.Attempts[left[0]].Host != "h-b" {
		t.Fatalf("after the target fell to 0: idle %v; want only h-b's, kept by its floor", left)
	}
}
