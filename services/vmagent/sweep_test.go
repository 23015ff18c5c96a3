package vmagent_test

import (
	"errors"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
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
	h.be.mu.Lock()
	h.be.inventory = []string{owned, orphan, foreign}
	h.be.mu.Unlock()

	h.waitCalls(t, "stop", orphan, 1)
	time.Sleep(300 * time.Millisecond) // several more sweeps
	if n := len(h.be.callsTo("stop", owned)); n != 0 {
		t.Errorf("owned VM stopped %d times by the sweep", n)
	}
	if n := len(h.be.callsTo("stop", foreign)); n != 0 {
		t.Errorf("a VM not named like an attempt was stopped %d times", n)
	}
}

// Given an inventory read that fails, nothing is stopped (law 7: a failed
// read is not a fact).
func TestAFailedInventoryReadStopsNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, sweepOpts)
	h.be.mu.Lock()
	h.be.inventory = []string{"berth-998-1"}
	h.be.listErr = errors.New("hypervisor API timed out")
	h.be.mu.Unlock()
	time.Sleep(600 * time.Millisecond) // three grace periods of failed reads
	if n := len(h.be.callsTo("stop", "berth-998-1")); n != 0 {
		t.Errorf("stopped %d times on failed reads", n)
	}
}
