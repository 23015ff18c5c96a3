package dispatch_test

import (
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/dispatch"
	"github.com/berth-ci/berth/services/testkit"
)

// Given a dispatcher, when it folds a placement carrying a sealed JIT
// config, then its fold has the attempt placed, with its runner, and no
// sealed config: only the agent that creates the VM opens it, and each
// running job's config cost its size in this fold (issue 19).
func TestTheDispatchersFoldKeepsNoSealedJITConfig(t *testing.T) {
	in := newIntake(t)
	d := newDispatcher(t, in, &countingMinter{}, dispatch.Options{})
	ref := testkit.Attempt(7, 1, "host-a")
	placed := events.New("test", time.Now(), &events.AttemptPlaced{AttemptRef: ref, JobID: 7, RunnerID: 70, Labels: testkit.Labels,
		SealedJIT: []byte("SEALED-JIT-CONFIG"), SealedBy: "XDISPATCHERKEY", SealedTo: "Xhost-a"})
	placed.Seq = 1
	deliver(d, placed)
	a := d.Fold.Attempts[ref.Attempt]
	if a == nil || !a.Placed || a.RunnerID != 70 {
		t.Fatalf("attempt %s not folded as placed with runner 70: %+v", ref.Attempt, a)
	}
	if a.SealedJIT != nil || a.SealedBy != "" || a.SealedTo != "" {
		t.Fatalf("the dispatcher's fold keeps the sealed JIT config: %q by %q to %q", a.SealedJIT, a.SealedBy, a.SealedTo)
	}
}
