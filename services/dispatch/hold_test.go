package dispatch_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/dispatch"
	"github.com/berth-ci/berth/services/testkit"
)

// countingMinter counts every call a dispatcher makes to GitHub.
type countingMinter struct{ calls atomic.Int64 }

func (m *countingMinter) Mint(context.Context, dispatch.MintRequest) (int64, string, error) {
	m.calls.Add(1)
	return 1, "jit", nil
}
func (m *countingMinter) JobState(context.Context, string, string, int64) (dispatch.JobState, error) {
	m.calls.Add(1)
	return dispatch.JobState{}, nil
}
func (m *countingMinter) Deregister(context.Context, int64, string, string) error {
	m.calls.Add(1)
	return nil
}

// Given GitHub said to wait (a 429 with Retry-After), when the dispatcher
// decides with queued demand and a surplus runner to deregister, then it
// books nothing and calls GitHub not at all until the wait is over (BL-37).
func TestWhileRateLimitedTheDispatcherBooksAndCallsNothing(t *testing.T) {
	in := newIntake(t) // an embedded server with the stream
	budget := &dispatch.Budget{}
	budget.Observe(&http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"60"}}}, nil, time.Now())
	m := &countingMinter{}
	d := newDispatcher(t, in, m, dispatch.Options{Budget: budget})
	seq := uint64(0)
	apply := func(ps ...events.Payload) {
		for _, p := range ps {
			seq++
			e := events.New("test", time.Now(), p)
			e.Seq = seq
			deliver(d, e)
		}
	}
	surplus := events.AttemptRef{Attempt: events.AttemptID(9, 1), Pool: "linux", Host: "h-a"}
	apply(host("h-a", 4, 4), queued(1), queued(2),
		&events.SlotReserved{Pool: "linux", Host: "h-a", Attempt: surplus.Attempt, JobID: 9, N: 1},
		&events.AttemptPlaced{AttemptRef: surplus, JobID: 9, RunnerID: 99})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d.Decide(ctx) // demand exceeds supply: a booking would follow
	if n := in.total(t); n != 0 {
		t.Errorf("%d facts appended while GitHub said to wait, want none", n)
	}
	apply(completed(1, "", "cancelled"), completed(2, "", "cancelled"))
	d.Decide(ctx) // now the placed runner is surplus: a deregistration would follow
	// Calls would run off the loop: watch for one over a window.
	testkit.Consistently(t, 300*time.Millisecond, "no GitHub call while rate limited", func() bool { return m.calls.Load() == 0 })
}
