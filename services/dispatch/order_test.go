package dispatch_test

import (
	"testing"

	"github.com/berth-ci/berth/events"
)

// GitHub delivers webhooks in any order and more than once (issue 5); the
// dispatcher books from the job's state, never from counting deliveries.

// A job waiting for an environment approval is not demand until it is
// queued: nothing is booked for it before.
func TestWaitingIsNotDemandUntilQueued(t *testing.T) {
	l := given(t).add(host("h-a", 2, 2), &events.JobWaiting{JobRef: ref(1)})
	if plan := l.decide(); len(plan.Reserve) != 0 {
		t.Fatalf("booked for a waiting job: %+v", plan.Reserve)
	}
	l.add(queued(1))
	if plan := l.decide(); len(plan.Reserve) != 1 {
		t.Fatalf("queued after waiting: %d bookings, want 1", len(plan.Reserve))
	}
}

// A completion that arrives before the job's queued delivery (or for a job
// Berth never saw) creates no demand, and the late queued delivery does not
// bring the job back.
func TestCompletedBeforeQueuedCreatesNoDemand(t *testing.T) {
	l := given(t).add(host("h-a", 2, 2), completed(1, "", "cancelled"))
	if plan := l.decide(); len(plan.Reserve) != 0 {
		t.Fatalf("booked for a completed job: %+v", plan.Reserve)
	}
	l.add(queued(1)) // the queued delivery arrives late
	if plan := l.decide(); len(plan.Reserve) != 0 {
		t.Fatalf("a late queued delivery revived a completed job: %+v", plan.Reserve)
	}
}

// The same queued delivery redelivered (days later, or by two replicas)
// books one slot, not two.
func TestARedeliveredQueuedBooksOnce(t *testing.T) {
	l := given(t).add(host("h-a", 4, 4), queued(1), queued(1), queued(1))
	plan := l.decide()
	if len(plan.Reserve) != 1 {
		t.Fatalf("%d bookings for one job delivered three times", len(plan.Reserve))
	}
	l.apply(plan)
	l.add(queued(1))
	if plan := l.decide(); len(plan.Reserve) != 0 {
		t.Fatalf("a redelivery after booking booked again: %+v", plan.Reserve)
	}
}
