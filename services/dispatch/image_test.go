package dispatch_test

import (
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/dispatch"
)

// Issue 20, item 7: an image whose runners GitHub refuses for their version
// is degraded on its host; its jobs are not charged.

// refusedBy folds attempt n of job on hostName as booted, then its agent's
// report that GitHub refused its runner's version.
func (l *log) refusedBy(job int64, n int, hostName string) *log {
	r := aref(job, n, hostName)
	l.add(&events.AttemptPlaced{AttemptRef: r, JobID: job, Labels: linux}, &events.AttemptProvisioning{AttemptRef: r},
		&events.AttemptRunnerStarted{AttemptRef: r},
		&events.AttemptRunnerVersion{AttemptRef: r, Image: "default/linux", Version: "2.310.0"},
		&events.AttemptRunnerRefused{AttemptRef: r, Image: "default/linux", Version: "2.310.0",
			Message: "An error occured: Runner version v2.310.0 is deprecated and cannot receive messages."})
	return l
}

// Given a job whose runner GitHub refused for its version on h-a, when the
// dispatcher decides, then the slot is released at once, charged to the
// image, the job keeps its attempts and stays demand, and it is booked on
// the healthy h-b, not on h-a, whose image is degraded.
func TestARefusedRunnerDegradesItsImageAndNeverChargesTheJob(t *testing.T) {
	l := given(t).add(host("h-a", 4, 4), queued(20), reserved(20, 1, "h-a")).refusedBy(20, 1, "h-a")
	l.add(host("h-b", 2, 2))
	plan := l.decideAt(t0.Add(time.Duration(l.n) * time.Second))
	if len(plan.Release) != 1 || plan.Release[0].Reason != events.ReleaseRunnerRefused || plan.Release[0].Culprit != events.CulpritImage {
		t.Fatalf("releases %+v; want the refused runner's, charged to the image", plan.Release)
	}
	if len(plan.Reserve) != 1 || plan.Reserve[0].Host != "h-b" {
		t.Fatalf("bookings %+v; want the job on h-b (h-a's image is degraded)", plan.Reserve)
	}
	l.apply(plan)
	if j := l.f.Jobs[20]; j.FailedAttempts != 0 || !j.Demand() {
		t.Fatalf("job 20: %d failed attempts, demand %v; want 0 and still demand", j.FailedAttempts, j.Demand())
	}
	if h := l.f.Hosts["h-a"]; h.Health.Degraded || len(h.Health.Failures) != 0 || h.ImageDegraded("linux") == nil {
		t.Fatalf("h-a: health %+v, image degraded %v; want the image degraded, not the host", h.Health, h.ImageDegraded("linux"))
	}
}

// Given the only host's image refused, jobs wait as demand (unschedulable
// never), one probe is booked after the back-off, none while it is in
// flight; a probe refused again doubles the back-off; a probe whose runner
// takes a job clears the image.
func TestADegradedImageGetsOneProbeAfterABackOffUntilARunnerTakesAJob(t *testing.T) {
	l := given(t).add(host("h-a", 4, 4), queued(21), queued(22), reserved(21, 1, "h-a")).refusedBy(21, 1, "h-a")
	refusedAt := t0.Add(time.Duration(l.n) * time.Second)
	plan := l.decideAt(refusedAt)
	if len(plan.Reserve) != 0 || len(plan.Unschedulable) != 0 {
		t.Fatalf("right after the refusal: bookings %+v, give-ups %+v; want none", plan.Reserve, plan.Unschedulable)
	}
	l.apply(plan)
	if plan := l.decideAt(refusedAt.Add(dispatch.DefaultProbeAfter - time.Second)); len(plan.Reserve) != 0 {
		t.Fatalf("inside the back-off: bookings %+v; want none", plan.Reserve)
	}
	plan = l.decideAt(refusedAt.Add(dispatch.DefaultProbeAfter))
	if len(plan.Reserve) != 1 || plan.Reserve[0].Host != "h-a" {
		t.Fatalf("after the back-off: bookings %+v; want one probe on h-a", plan.Reserve)
	}
	l.apply(plan)
	probe := plan.Reserve[0]
	l.add(booted(probe.JobID, probe.N, "h-a")[1:]...)
	if again := l.decideAt(refusedAt.Add(time.Hour)); len(again.Reserve) != 0 {
		t.Fatalf("a probe is in flight: bookings %+v; want none", again.Reserve)
	}

	// The probe is refused too: the back-off doubles from its refusal.
	r := aref(probe.JobID, probe.N, "h-a")
	l.add(&events.AttemptRunnerRefused{AttemptRef: r, Image: "default/linux", Version: "2.310.0", Message: "deprecated"})
	again := t0.Add(time.Duration(l.n) * time.Second)
	l.apply(l.decideAt(again))
	if plan := l.decideAt(again.Add(2*dispatch.DefaultProbeAfter - time.Second)); len(plan.Reserve) != 0 {
		t.Fatalf("inside the doubled back-off: bookings %+v; want none", plan.Reserve)
	}
	plan = l.decideAt(again.Add(2 * dispatch.DefaultProbeAfter))
	if len(plan.Reserve) != 1 {
		t.Fatalf("after the doubled back-off: bookings %+v; want one probe", plan.Reserve)
	}
	l.apply(plan)

	// The operator rebuilt the image: the probe's runner takes a job, and
	// the image books as usual again.
	probe = plan.Reserve[0]
	l.add(booted(probe.JobID, probe.N, "h-a")[1:]...)
	l.add(inProgress(probe.JobID, attempt(probe.JobID, probe.N)))
	l.apply(l.decideAt(again.Add(time.Hour)))
	bound := dispatch.Decide(l.f, dispatch.Params{Now: again.Add(time.Hour)}).Bound
	for i := range bound {
		l.add(&bound[i])
	}
	if l.f.Hosts["h-a"].ImageDegraded("linux") != nil {
		t.Fatalf("the image is still degraded after a runner of it took a job: %+v", l.f.Hosts["h-a"].Images)
	}
}
