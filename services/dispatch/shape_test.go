package dispatch_test

import (
	"strings"
	"testing"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/dispatch"
)

// shapedHost offers pool linux (2 CPU) and its shape l (8 CPU, runner
// label berth-size-l) from 12 CPUs, with slots and a physical cap to spare.
func shapedHost(name string) *events.HostOnline {
	return &events.HostOnline{Host: name, Boot: "boot-1", PhysicalCap: 10, CurveKey: "X" + name, Backend: "exec",
		Resources: &events.Resources{CPU: 12},
		Pools: map[string]events.PoolSlots{
			"linux":   {Labels: linux, Slots: 8, Shape: &events.Shape{CPU: 2}},
			"linux-l": {Labels: append([]string{"berth-size-l"}, linux...), Slots: 8, Shape: &events.Shape{CPU: 8}},
		}}
}

// Given one 12-CPU host with shapes linux (2 CPU) and linux-l (8 CPU), when
// three small jobs and two L jobs are queued, then the small ones are booked
// (6 CPUs) and no L job is (6+8 > 12, although slots and the physical cap
// have room); when the small jobs' VMs are gone, then one L job is booked on
// the L pool with the shape's runner labels, and the second waits (8+8 > 12).
func TestPlacementCountsTheShapesResources(t *testing.T) {
	l := given(t).add(shapedHost("h-a"), queued(3), queued(4), queued(5),
		queued(1, "self-hosted", "linux", "berth-size-l"), queued(2, "self-hosted", "linux", "berth-size-l"))

	plan := l.decide()
	if got := pools(plan); len(got["linux"]) != 3 || len(got["linux-l"]) != 0 || len(plan.Unschedulable) != 0 {
		t.Fatalf("booked %v (unschedulable %v), want the 3 small jobs only", got, plan.Unschedulable)
	}
	l.apply(plan)
	for _, r := range plan.Reserve {
		ar := events.AttemptRef{Attempt: r.Attempt, Pool: r.Pool, Host: r.Host}
		l.add(&events.SlotReleased{Pool: r.Pool, Host: r.Host, Attempt: r.Attempt, Reason: events.ReleaseSurplus, JobID: r.JobID},
			&events.AttemptStopped{AttemptRef: ar}, &events.JobCompleted{JobRef: ref(r.JobID), Conclusion: "cancelled"})
	}

	plan = l.decide()
	if got := pools(plan); len(got["linux-l"]) != 1 || len(got["linux"]) != 0 {
		t.Fatalf("booked %v, want one L job (8 of 12 CPUs; a second would need 16)", got)
	}
	if r := plan.Reserve[0]; !events.Serves(r.Labels, []string{"self-hosted", "linux", "berth-size-l"}) {
		t.Errorf("the L runner's labels %v lack the shape's", r.Labels)
	}
	if again := l.apply(plan).decide(); len(again.Reserve) != 0 {
		t.Fatalf("the next round booked %+v on a full host", again.Reserve)
	}
}

func pools(p dispatch.Plan) map[string][]int64 {
	out := map[string][]int64{}
	for _, r := range p.Reserve {
		out[r.Pool] = append(out[r.Pool], r.JobID)
	}
	return out
}

// Given pools with shapes, when a job asks for a shape no pool offers, then
// it is unschedulable with a reason naming the label and the shapes on offer,
// and nothing is booked for it on the default shape.
func TestAJobAskingForAnUnknownShapeIsUnschedulableWithTheReason(t *testing.T) {
	plan := given(t).add(shapedHost("h-a"), queued(9, "self-hosted", "linux", "berth-size-xxl")).decide()
	if len(plan.Reserve) != 0 {
		t.Fatalf("an unknown shape was booked: %+v", plan.Reserve)
	}
	if len(plan.Unschedulable) != 1 || plan.Unschedulable[0].JobID != 9 ||
		!strings.Contains(plan.Unschedulable[0].Reason, "berth-size-xxl") || !strings.Contains(plan.Unschedulable[0].Reason, "berth-size-l") {
		t.Fatalf("unschedulable %+v, want job 9 naming berth-size-xxl and the offered berth-size-l", plan.Unschedulable)
	}
}
