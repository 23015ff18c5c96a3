package vmagent_test

import (
	"errors"
	"testing"
	"time"

	"fmt"
	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/services/vmagent"
)

func sweepOpts(o *vmagent.Options) {
	o.InventoryEvery = 50 * time.Millisecond
	o.OrphanGrace = 200 * time.Millisecond
}

// Given a host whose backend lists a VM named like an attempt that no live
// attempt owns (BL-35, BL-36: left over from a crash), when it has been seen
// for the grace period, then the agent stops it; a VM that a running attempt
// owns, and a VM not named like Berth's, are never touched.
func TestOrphanSweepStopsOnlyUnownedBerthVMs(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sweepOpts)
	const owned, orphan, foreign = "berth-501-1", "berth-999-1", "somebody-elses-vm"
	h.place(t, h.host, owned, 501, []byte("jit"))
	h.wait(t, owned, events.TypeAttemptRunnerStarted)
	h.be.SetInventory([]string{owned, orphan, foreign}, nil)

	h.waitCalls(t, "stop", orphan, 1)
	h.sweeps(t, 3, "the owned VM or the foreign VM stopped", func() bool {
		return len(h.be.Calls("stop", owned)) > 0 || len(h.be.Calls("stop", foreign)) > 0
	})
}

// Given an inventory read that fails, nothing is stopped (law 7: a failed
// read is not a fact).
func TestAFailedInventoryReadStopsNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sweepOpts)
	h.be.SetInventory([]string{"berth-998-1"}, errors.New("hypervisor API timed out"))
	h.sweeps(t, 3, "stopped on failed reads", func() bool { return len(h.be.Calls("stop", "berth-998-1")) > 0 })
}

// sweeps waits until the agent has read its inventory n more times (each
// read is a sweep; reads follow the loop's tick, so n reads span more than
// the 200 ms grace), failing at once if wrong() holds meanwhile.
func (h *harness) sweeps(t *testing.T, n int, wrong string, wrongHolds func() bool) {
	t.Helper()
	from := h.be.Count(testkit.StepList)
	testkit.Eventually(t, waitLimit, fmt.Sprintf("%d more inventory reads", n), func() bool {
		if wrongHolds() {
			t.Fatalf("%s after %d inventory reads", wrong, h.be.Count(testkit.StepList)-from)
		}
		return h.be.Count(testkit.StepList) >= from+n
	})
}
