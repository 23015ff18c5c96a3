package dispatch_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/berth-ci/berth/events"
)

// react plays the rest of the system after each fact until nothing more
// follows: the dispatcher's plan is appended, every booked attempt is
// placed and its runner comes up (the agent), every teardown ends in a stop,
// and a surplus runner is deregistered and its slot released (what the
// dispatcher does once GitHub confirms). The fleet invariants are checked
// at every step.
func (l *log) react() {
	l.t.Helper()
	for round := 0; round < 20; round++ {
		plan := l.decide()
		l.apply(plan)
		moved := len(plan.Release)+len(plan.Teardown)+len(plan.Unschedulable)+len(plan.Reserve)+len(plan.Conflicts) > 0
		for _, a := range l.f.Attempts {
			r := events.AttemptRef{Attempt: a.ID, Pool: a.Pool, Host: a.Host}
			switch {
			case a.Held() && !a.Placed && !a.TeardownReq:
				l.add(&events.AttemptPlaced{AttemptRef: r, JobID: a.JobID, Labels: a.Labels},
					&events.AttemptProvisioning{AttemptRef: r}, &events.AttemptRunnerStarted{AttemptRef: r})
				moved = true
			case a.TeardownReq && !a.Stopped:
				l.add(&events.AttemptStopped{AttemptRef: r})
				moved = true
			}
		}
		for _, a := range append(plan.Deregister, plan.Cleanup...) {
			r := events.AttemptRef{Attempt: a.ID, Pool: a.Pool, Host: a.Host}
			l.add(&events.AttemptDeregistered{AttemptRef: r})
			if a.Held() && l.f.BoundJob(a.ID) == 0 {
				l.add(&events.SlotReleased{Pool: a.Pool, Host: a.Host, Attempt: a.ID, Reason: events.ReleaseSurplus, JobID: a.JobID})
			}
			moved = true
		}
		if !moved {
			return
		}
	}
	l.t.Fatal("the system did not settle in 20 rounds")
}

// outcome is what must not depend on the order the webhooks came in: the
// job's state, and the fleet's books once everything settled.
func (l *log) outcome(job int64) string {
	j := l.f.Jobs[job]
	st := l.f.Status()
	var pools []string
	for _, p := range st.Pools {
		pools = append(pools, fmt.Sprintf("%s held=%d running=%d provisioning=%d demand=%d", p.Name, p.Held, p.Running, p.Provisioning, p.PendingDemand))
	}
	live := 0
	for _, a := range l.f.Attempts {
		if !a.Stopped || a.Held() {
			live++
		}
	}
	return fmt.Sprintf("job %d %v %s runner=%s demand=%v; %s; live attempts=%d; vms=%d",
		job, j.Status, j.Conclusion, j.Runner, j.Demand(), strings.Join(pools, ", "), live, st.Hosts[0].LiveVMs)
}

// BL-19 (a): GitHub delivers queued, in_progress and completed in any order
// and may repeat any of them. Whatever the order, with the rest of the
// system reacting after each delivery, one job ends in the same state: done,
// with the conclusion and runner GitHub gave, no slot held, no demand, no VM
// left, and no slot released twice (the fleet invariants hold throughout).
// Every one of the 6 orders is played plain, with each delivery repeated at
// once, and with all three repeated at the end.
func TestEveryOrderOfOneJobsWebhooksEndsTheSame(t *testing.T) {
	const job = 1
	runner := attempt(job, 1) // the runner booked first for the job takes it
	hooks := map[byte]events.Payload{
		'q': queued(job),
		'i': inProgress(job, runner),
		'c': completed(job, runner, "success"),
	}
	orders := []string{"qic", "qci", "iqc", "icq", "cqi", "ciq"}
	want := ""
	for _, order := range orders {
		for _, variant := range []string{"plain", "each twice", "all again"} {
			seq := order
			switch variant {
			case "each twice":
				seq = string([]byte{order[0], order[0], order[1], order[1], order[2], order[2]})
			case "all again":
				seq = order + order
			}
			t.Run(order+"/"+variant, func(t *testing.T) {
				l := given(t).add(host("h-a", 2, 2))
				for i := range seq {
					l.add(hooks[seq[i]])
					l.react()
				}
				got := l.outcome(job)
				if !strings.HasPrefix(got, "job 1 completed success runner="+runner+" demand=false; linux held=0 running=0 provisioning=0 demand=0; live attempts=0; vms=0") {
					t.Fatalf("after %s: %s", seq, got)
				}
				if plan := l.decide(); len(plan.Reserve)+len(plan.Mint)+len(plan.Release) > 0 {
					t.Fatalf("after %s the dispatcher still acts: %+v", seq, plan)
				}
				if want == "" {
					want = got
				} else if got != want {
					t.Fatalf("after %s: %s\nafter %s: %s", seq, got, orders[0], want)
				}
				reserved := 0
				for _, a := range l.f.Attempts {
					if a.JobID == job && a.Reserved {
						reserved++
					}
				}
				if reserved > 1 {
					t.Fatalf("after %s: %d slots booked for one job", seq, reserved)
				}
			})
		}
	}
}

// BL-19 (b): the true order was queued, waiting, queued, but the receiver
// got queued, queued, waiting. The stale waiting does not take the job's
// demand away: one slot is booked, and only one.
func TestAStaleWaitingAfterQueuedKeepsTheDemand(t *testing.T) {
	l := given(t).add(host("h-a", 2, 2), queued(2), queued(2), &events.JobWaiting{JobRef: ref(2)})
	plan := l.decide()
	if len(plan.Reserve) != 1 || plan.Reserve[0].JobID != 2 {
		t.Fatalf("reserve %+v, want one slot for job 2", plan.Reserve)
	}
	l.apply(plan)
	if plan := l.decide(); len(plan.Reserve) != 0 {
		t.Fatalf("booked again: %+v", plan.Reserve)
	}
}

// BL-17: GitHub reports a second job in progress on a runner that already
// runs one. One VM runs one job: the second binding is rejected in state
// (a job.conflict fact, once), the runner's VM stays bound to its first job
// and is stopped only when that job completes, with one release; the second
// job stays demand and is booked a VM of its own, released when it
// completes.
func TestASecondJobOnABusyRunnerGetsAVMOfItsOwn(t *testing.T) {
	l := given(t).add(host("h-a", 3, 3)).add(running(1, "h-a")...).add(queued(2))
	l.react()
	first := l.f.Attempts[attempt(2, 1)] // booked for job 2 while queued
	l.add(inProgress(2, attempt(1, 1)))
	plan := l.decide()
	want := []events.JobConflict{{JobID: 2, Runner: attempt(1, 1), BoundJob: 1}}
	if !reflect.DeepEqual(plan.Conflicts, want) {
		t.Fatalf("conflicts %+v, want %+v", plan.Conflicts, want)
	}
	l.react()
	if plan := l.decide(); len(plan.Conflicts) != 0 {
		t.Fatalf("conflict recorded again: %+v", plan.Conflicts)
	}
	a := l.f.Attempts[attempt(1, 1)]
	if !a.Held() || a.TeardownReq || l.f.BoundJob(a.ID) != 1 {
		t.Fatalf("after a second in_progress on its runner: held %v, teardown %v, bound to %d; want held, running job 1",
			a.Held(), a.TeardownReq, l.f.BoundJob(a.ID))
	}
	if first == nil || !first.Held() {
		t.Fatalf("job 2's own booking %+v: want it kept, job 2 is still demand", first)
	}
	l.add(completed(1, attempt(1, 1), "success"))
	l.react()
	if !a.TeardownReq || a.Held() || !first.Held() {
		t.Fatalf("job 1 completed: its VM teardown %v, held %v; job 2's booking held %v; want job 1's VM stopped, job 2's kept",
			a.TeardownReq, a.Held(), first.Held())
	}
	l.add(completed(2, attempt(1, 1), "failure"))
	l.react()
	if first.Held() {
		t.Fatalf("job 2 completed: its own booking is still held")
	}
	if a.Releases() != 1 {
		t.Fatalf("job 1's attempt released %d times, want 1", a.Releases())
	}
	if vs := l.f.Check(); len(vs) > 0 {
		t.Fatalf("invariants: %v", vs)
	}
}
