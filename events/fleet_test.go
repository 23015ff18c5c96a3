package events_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
)

func TestHappyPathCountsEveryStep(t *testing.T) {
	const a, pool, host = "berth-42-1", "macos", "mac-1"
	r := ref(a, pool, host)
	type counters struct{ poolHeld, hostHeld, live, booked int }
	steps := []struct {
		name  string
		fact  events.Payload
		want  counters
		stage string
	}{
		{"host online", hostOnline(host, 2, map[string]int{pool: 2}), counters{0, 0, 0, 0}, ""},
		{"job queued", &events.JobQueued{JobRef: job(42, "self-hosted", "macos")}, counters{0, 0, 0, 0}, ""},
		{"slot reserved", reserve(a, pool, host, 42), counters{1, 1, 0, 1}, "reserved"},
		{"placed", &events.AttemptPlaced{AttemptRef: r, JobID: 42}, counters{1, 1, 0, 1}, "placed"},
		{"provisioning", &events.AttemptProvisioning{AttemptRef: r}, counters{1, 1, 1, 1}, "provisioning"},
		{"runner started", &events.AttemptRunnerStarted{AttemptRef: r}, counters{1, 1, 1, 1}, "running"},
		{"in progress", &events.JobInProgress{JobRef: job(42, "self-hosted", "macos"), RunnerName: a}, counters{1, 1, 1, 1}, "running"},
		{"completed", &events.JobCompleted{JobRef: job(42, "self-hosted", "macos"), RunnerName: a, Conclusion: "success"}, counters{1, 1, 1, 1}, "running"},
		{"slot released", release(a, pool, host, events.ReleaseCompleted), counters{0, 0, 1, 1}, "running"},
		{"teardown requested", &events.AttemptTeardownRequested{AttemptRef: r, Reason: "completed"}, counters{0, 0, 1, 1}, "teardown"},
		{"stopped", &events.AttemptStopped{AttemptRef: r}, counters{0, 0, 0, 0}, "stopped"},
	}
	f := events.NewFleet()
	var s script
	for _, st := range steps {
		apply(f, s.add(st.fact))
		got := counters{}
		if p := f.Pools[pool]; p != nil {
			got.poolHeld = p.Held
		}
		h := f.Hosts[host]
		got.hostHeld, got.live, got.booked = h.Held[pool], h.LiveVMs, h.Booked
		if got != st.want {
			t.Fatalf("after %s: counters %+v, want %+v", st.name, got, st.want)
		}
		if at := f.Attempts[a]; st.stage != "" && at.Stage() != st.stage {
			t.Fatalf("after %s: stage %s, want %s", st.name, at.Stage(), st.stage)
		}
		if vs := f.Check(); len(vs) != 0 {
			t.Fatalf("after %s: violations %v", st.name, vs)
		}
		switch st.name {
		case "job queued":
			p := poolStatus(t, f, pool)
			if p.Capacity != 2 || p.Held != 0 || p.PendingDemand != 1 || p.WaitingForSlot != 1 || len(p.HeldBy) != 0 {
				t.Fatalf("after %s: status %+v", st.name, p)
			}
		case "placed":
			p := poolStatus(t, f, pool)
			want := []events.HeldSlot{{Attempt: a, Host: host, Stage: "placed", JobID: 42}}
			if p.Capacity != 2 || p.Held != 1 || p.Provisioning != 1 || p.Running != 0 ||
				p.PendingDemand != 1 || p.WaitingForSlot != 0 || !reflect.DeepEqual(p.HeldBy, want) {
				t.Fatalf("after %s: status %+v", st.name, p)
			}
		case "in progress":
			p := poolStatus(t, f, pool)
			want := []events.HeldSlot{{Attempt: a, Host: host, Stage: "running", JobID: 42, Bound: 42}}
			if p.Held != 1 || p.Running != 1 || p.Provisioning != 0 || p.PendingDemand != 0 ||
				!reflect.DeepEqual(p.HeldBy, want) {
				t.Fatalf("after %s: status %+v", st.name, p)
			}
			if f.BoundJob(a) != 42 || f.Jobs[42].Status != events.StatusInProgress {
				t.Fatalf("after %s: bound %d, job status %s", st.name, f.BoundJob(a), f.Jobs[42].Status)
			}
		case "slot released":
			p := poolStatus(t, f, pool)
			if p.Held != 0 || p.Running != 0 || len(p.HeldBy) != 0 {
				t.Fatalf("after %s: status %+v", st.name, p)
			}
			if hs := f.Status().Hosts[0]; hs.LiveVMs != 1 || hs.Held[pool] != 0 {
				t.Fatalf("after %s: host status %+v: the VM outlives the slot", st.name, hs)
			}
		}
	}
	if f.Jobs[42].Status != events.StatusCompleted || f.Jobs[42].Conclusion != "success" {
		t.Fatalf("job %+v", f.Jobs[42])
	}
	if !f.Attempts[a].Terminal() {
		t.Fatalf("attempt %+v is not terminal after stop", f.Attempts[a])
	}
}

func TestJobStatusOnlyMovesForward(t *testing.T) {
	j := job(7, "linux")
	tests := []struct {
		name string
		h    []events.Event
		want events.JobStatus
	}{
		{"late queued after completed", []events.Event{
			ev(2, 2, &events.JobCompleted{JobRef: j, Conclusion: "success"}),
			ev(1, 1, &events.JobQueued{JobRef: j})}, events.StatusCompleted},
		{"late in_progress after completed", []events.Event{
			ev(3, 3, &events.JobCompleted{JobRef: j, RunnerName: "r"}),
			ev(2, 2, &events.JobInProgress{JobRef: j, RunnerName: "r"})}, events.StatusCompleted},
		{"waiting then queued", []events.Event{
			ev(1, 1, &events.JobWaiting{JobRef: j}),
			ev(2, 2, &events.JobQueued{JobRef: j})}, events.StatusQueued},
		{"queued then late waiting", []events.Event{
			ev(2, 2, &events.JobQueued{JobRef: j}),
			ev(1, 1, &events.JobWaiting{JobRef: j})}, events.StatusQueued},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := given(tt.h...)
			if got := f.Jobs[7].Status; got != tt.want {
				t.Fatalf("status %s, want %s", got, tt.want)
			}
		})
	}
}

func TestReleasedBeforeReservedIsNeverHeld(t *testing.T) {
	f := given(
		ev(1, 1, hostOnline("h1", 2, map[string]int{"linux": 1})),
		ev(3, 3, release("berth-1-1", "linux", "h1", events.ReleaseSurplus)),
		ev(2, 2, reserve("berth-1-1", "linux", "h1", 1)),
	)
	a := f.Attempts["berth-1-1"]
	if a.Held() || f.Pools["linux"].Held != 0 || f.Hosts["h1"].Held["linux"] != 0 || f.Hosts["h1"].Booked != 0 {
		t.Fatalf("out-of-order release left a slot held: attempt %+v pool %+v host %+v", a, f.Pools["linux"], f.Hosts["h1"])
	}
	if a.JobID != 1 || a.ReleaseReason != events.ReleaseSurplus {
		t.Fatalf("attempt %+v", a)
	}
	if vs := f.Check(); len(vs) != 0 {
		t.Fatalf("violations %v", vs)
	}
}

func TestAbandonedVMOccupiesPhysicalCapacityUntilLateStop(t *testing.T) {
	r := ref("berth-5-1", "macos", "mac-1")
	var s script
	f := given(
		s.add(hostOnline("mac-1", 2, map[string]int{"macos": 2})),
		s.add(reserve(r.Attempt, r.Pool, r.Host, 5)),
		s.add(&events.AttemptPlaced{AttemptRef: r, JobID: 5}),
		s.add(&events.AttemptProvisioning{AttemptRef: r}),
		s.add(&events.AttemptRunnerStarted{AttemptRef: r}),
		s.add(release(r.Attempt, r.Pool, r.Host, events.ReleaseCompleted)),
		s.add(&events.AttemptTeardownRequested{AttemptRef: r}),
		s.add(&events.AttemptAbandoned{AttemptRef: r, Step: "stop"}),
	)
	h := f.Hosts["mac-1"]
	if h.LiveVMs != 1 || h.AbandonedVMs != 1 || h.Booked != 1 || f.Pools["macos"].Held != 0 {
		t.Fatalf("after abandon: host %+v pool held %d", h, f.Pools["macos"].Held)
	}
	if p := poolStatus(t, f, "macos"); p.AbandonedVMs != 1 || p.Held != 0 {
		t.Fatalf("after abandon: status %+v", p)
	}
	if f.Attempts[r.Attempt].Terminal() {
		t.Fatal("an abandoned VM is not terminal")
	}

	f.Apply(s.add(&events.AttemptStopped{AttemptRef: r, Late: true}))
	if h.LiveVMs != 0 || h.AbandonedVMs != 0 || h.Booked != 0 {
		t.Fatalf("after late stop: host %+v", h)
	}
	if p := poolStatus(t, f, "macos"); p.AbandonedVMs != 0 {
		t.Fatalf("after late stop: status %+v", p)
	}
	if a := f.Attempts[r.Attempt]; !a.StoppedLate || a.Stage() != "stopped" {
		t.Fatalf("attempt %+v", a)
	}
	if vs := f.Check(); len(vs) != 0 {
		t.Fatalf("violations %v", vs)
	}
}

func TestCheckReportsSlotHeldByStoppedAttempt(t *testing.T) {
	r := ref("berth-9-1", "linux", "h1")
	f := given(
		ev(1, 1, hostOnline("h1", 4, map[string]int{"linux": 2})),
		ev(2, 2, reserve(r.Attempt, r.Pool, r.Host, 9)),
		ev(3, 3, &events.AttemptProvisioning{AttemptRef: r}),
		ev(4, 4, &events.AttemptStopped{AttemptRef: r}),
	)
	if got := rules(f.Check()); !reflect.DeepEqual(got, []string{events.RuleHeldHasAttempt}) {
		t.Fatalf("violations %v, want only %s", f.Check(), events.RuleHeldHasAttempt)
	}
	if h := f.Hosts["h1"]; h.Booked != 0 || h.LiveVMs != 0 || h.Held["linux"] != 1 {
		t.Fatalf("host %+v: a stopped VM occupies no physical capacity, its leaked slot stays held", h)
	}
	f.Apply(ev(5, 5, release(r.Attempt, r.Pool, r.Host, events.ReleaseProvisionTimeout)))
	if vs := f.Check(); len(vs) != 0 {
		t.Fatalf("after release: violations %v", vs)
	}
}

func TestCheckReportsDistinctReleasesOfOneAttempt(t *testing.T) {
	h := []events.Event{
		ev(1, 1, hostOnline("h1", 4, map[string]int{"linux": 2})),
		ev(2, 2, reserve("berth-3-1", "linux", "h1", 3)),
		ev(3, 3, release("berth-3-1", "linux", "h1", events.ReleaseCompleted)),
	}
	// A redelivery of the same fact (same Seq) is no second release.
	if vs := given(append(h, h[2])...).Check(); len(vs) != 0 {
		t.Fatalf("duplicate delivery: violations %v", vs)
	}
	f := given(append(h, ev(4, 4, release("berth-3-1", "linux", "h1", events.ReleaseHostLost)))...)
	if got := rules(f.Check()); !reflect.DeepEqual(got, []string{events.RuleReleasedOnce}) {
		t.Fatalf("violations %v, want only %s", f.Check(), events.RuleReleasedOnce)
	}
	if a := f.Attempts["berth-3-1"]; a.Releases() != 2 || a.ReleaseReason != events.ReleaseCompleted {
		t.Fatalf("attempt %+v: want 2 releases, the first reason kept", a)
	}
	if f.Pools["linux"].Held != 0 {
		t.Fatalf("pool held %d after two releases", f.Pools["linux"].Held)
	}
}

func TestUnknownPayloadIsSkippedAndChangesNothingElse(t *testing.T) {
	var s script
	f := given(
		s.add(hostOnline("h1", 2, map[string]int{"linux": 2})),
		s.add(&events.JobQueued{JobRef: job(1, "linux")}),
		s.add(reserve("berth-1-1", "linux", "h1", 1)),
	)
	before := f.Status()
	f.Apply(events.Event{ID: "future-1", Source: "future", Time: t0, Subject: "berth.evt.job.1", Seq: 2})
	after := f.Status()
	if f.Skipped != 1 || after.Skipped != 1 {
		t.Fatalf("Skipped = %d (status %d), want 1", f.Skipped, after.Skipped)
	}
	after.Skipped = before.Skipped
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("unknown event changed the status:\nbefore %+v\n after %+v", before, after)
	}
	if len(f.Jobs) != 1 || len(f.Attempts) != 1 || len(f.Hosts) != 1 || f.Pools["linux"].Held != 1 {
		t.Fatalf("unknown event changed the records: %d jobs, %d attempts, %d hosts", len(f.Jobs), len(f.Attempts), len(f.Hosts))
	}
}

func TestCordonIsLastWriterWinsByEventTime(t *testing.T) {
	hc := func(sec int) events.HostChange {
		return events.HostChange{Host: "h1", Reason: "abandoned VMs", At: t0.Add(time.Duration(sec) * time.Second)}
	}
	online := ev(1, 1, hostOnline("h1", 2, map[string]int{"linux": 1}))
	cordon := ev(2, 10, &events.HostCordoned{HostChange: hc(10)})
	uncordon := ev(3, 20, &events.HostUncordoned{HostChange: hc(20)})
	lateCordon := ev(4, 30, &events.HostCordoned{HostChange: hc(30)})
	tests := []struct {
		name string
		h    []events.Event
		want bool
	}{
		{"cordon then uncordon", []events.Event{online, cordon, uncordon}, false},
		{"uncordon applied before the older cordon", []events.Event{online, uncordon, cordon}, false},
		{"cordon, uncordon, cordon", []events.Event{online, cordon, uncordon, lateCordon}, true},
		{"newest cordon applied first", []events.Event{lateCordon, uncordon, online, cordon}, true},
		{"duplicate of the older cordon after uncordon", []events.Event{online, cordon, uncordon, cordon}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := given(tt.h...)
			h := f.Hosts["h1"]
			if h.Cordoned != tt.want || h.Accepts() == tt.want {
				t.Fatalf("cordoned %v accepts %v, want cordoned %v", h.Cordoned, h.Accepts(), tt.want)
			}
			if tt.want && h.CordonReason != "abandoned VMs" || !tt.want && h.CordonReason != "" {
				t.Fatalf("cordon reason %q", h.CordonReason)
			}
			if p := poolStatus(t, f, "linux"); tt.want != (len(p.CordonedHosts) == 1) {
				t.Fatalf("status cordoned hosts %v", p.CordonedHosts)
			}
		})
	}
}

func TestBoundJobFollowsTheRunnerNameNotTheBooking(t *testing.T) {
	a := ref("berth-1-1", "linux", "h1") // booked for job 1
	b := ref("berth-2-1", "linux", "h1") // booked for job 2
	var s script
	f := given(
		s.add(hostOnline("h1", 4, map[string]int{"linux": 2})),
		s.add(&events.JobQueued{JobRef: job(1, "linux")}),
		s.add(&events.JobQueued{JobRef: job(2, "linux")}),
		s.add(reserve(a.Attempt, "linux", "h1", 1)),
		s.add(reserve(b.Attempt, "linux", "h1", 2)),
		s.add(&events.AttemptRunnerStarted{AttemptRef: a}),
		// GitHub hands runner berth-1-1 job 2.
		s.add(&events.JobInProgress{JobRef: job(2, "linux"), RunnerName: a.Attempt}),
	)
	if f.BoundJob(a.Attempt) != 2 || f.BoundJob(b.Attempt) != 0 {
		t.Fatalf("BoundJob(%s) = %d, BoundJob(%s) = %d; want 2 and 0",
			a.Attempt, f.BoundJob(a.Attempt), b.Attempt, f.BoundJob(b.Attempt))
	}
	if f.Attempts[a.Attempt].JobID != 1 || f.Jobs[2].Runner != a.Attempt || f.Jobs[1].Runner != "" {
		t.Fatalf("booking or runner changed: attempt %+v job1 %+v job2 %+v", f.Attempts[a.Attempt], f.Jobs[1], f.Jobs[2])
	}
	p := poolStatus(t, f, "linux")
	want := []events.HeldSlot{
		{Attempt: a.Attempt, Host: "h1", Stage: "running", JobID: 1, Bound: 2},
		{Attempt: b.Attempt, Host: "h1", Stage: "reserved", JobID: 2},
	}
	if !reflect.DeepEqual(p.HeldBy, want) || p.Running != 1 || p.Provisioning != 1 || p.PendingDemand != 1 || p.WaitingForSlot != 0 {
		t.Fatalf("status %+v", p)
	}
	// The completion names the runner, so it is the attempt that ran job 2.
	f.Apply(s.add(&events.JobCompleted{JobRef: job(2, "linux"), RunnerName: a.Attempt}))
	if f.BoundJob(a.Attempt) != 2 {
		t.Fatalf("after completion BoundJob = %d", f.BoundJob(a.Attempt))
	}
}

func TestLostHostOffersNoCapacityAndDrainingStillDoes(t *testing.T) {
	hc := func(sec int) events.HostChange {
		return events.HostChange{Host: "h2", At: t0.Add(time.Duration(sec) * time.Second)}
	}
	f := given(
		ev(1, 1, hostOnline("h1", 4, map[string]int{"linux": 2})),
		ev(2, 2, hostOnline("h2", 4, map[string]int{"linux": 3})),
		ev(3, 3, &events.HostDraining{HostChange: hc(3)}),
	)
	if c := f.Capacity("linux"); c != 5 {
		t.Fatalf("capacity with a draining host %d, want 5", c)
	}
	f.Apply(ev(4, 4, &events.HostLost{HostChange: hc(4)}))
	if c := f.Capacity("linux"); c != 2 || f.Hosts["h2"].Accepts() {
		t.Fatalf("capacity with a lost host %d (want 2), accepts %v", c, f.Hosts["h2"].Accepts())
	}
	// A host that comes back with a new boot is online again.
	back := hostOnline("h2", 4, map[string]int{"linux": 3})
	back.Boot = "boot-2"
	f.Apply(ev(5, 5, back))
	if c := f.Capacity("linux"); c != 5 || !f.Hosts["h2"].Accepts() || f.Hosts["h2"].Boot != "boot-2" {
		t.Fatalf("after coming back: capacity %d, host %+v", c, f.Hosts["h2"])
	}
}

// A message skipped on a pool's ledger (undecodable, or a version this
// build does not know) still moves that ledger's last sequence: otherwise
// every later booking there fails its expected-sequence check forever.
func TestASkippedMessageOnAPoolLedgerMovesItsSequence(t *testing.T) {
	f := events.NewFleet()
	f.Skip(41, events.PoolSubject("macos"))
	if p := f.Pools["macos"]; p == nil || p.LastSeq != 41 {
		t.Fatalf("pool ledger after a skipped message: %+v, want LastSeq 41", p)
	}
	f.Skip(42, events.JobSubject(7))
	if f.LastSeq != 42 || f.Skipped != 2 {
		t.Fatalf("LastSeq %d Skipped %d", f.LastSeq, f.Skipped)
	}
}
