package scenario

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
)

// BL-23, BL-24, law 7 (the host keeps counting a VM after its stop said it
// was gone): given a stop step that reports success but leaves the VM, when
// a job completes, then Berth records the VM stopped, as the stop said, but
// the agent's orphan sweep finds it in the backend's inventory, owned by no
// live attempt, and stops it again after the grace period, together with a
// VM named like an attempt Berth has no record of; a VM not named like
// Berth's is never touched; while the inventory cannot be read, nothing is
// stopped (a failed read is not a fact), and the sweep appends no second
// fact about the attempt.
func TestAVMTheHostStillCountsAfterItsStopIsFoundByTheSweepAndStopped(t *testing.T) {
	w := start(t, func(c *config.Config) {
		c.Agents[0].InventoryEvery = 300 * time.Millisecond
		c.Agents[0].OrphanGrace = time.Second
	})
	w.fault("host-a", "stop-leak", "*")
	w.fault("host-a", "list-fail", "*")

	j := w.enqueue(linuxLabels, 200*time.Millisecond)
	a := events.AttemptID(j, 1)
	w.await("the job completed", 15*time.Second, w.jobIs(j, "completed"))
	w.awaitFact(events.TypeAttemptStopped, a, 5*time.Second)
	if c := w.calls("host-a", "stop", a); c.starts != 1 || !slices.Equal(c.statuses, []string{"0"}) {
		t.Fatalf("stop calls %+v, want one that reported success", c)
	}
	if vms := w.vms("host-a"); !slices.Equal(vms, []string{a}) {
		t.Fatalf("backend inventory %v: the lying stop should have left %s", vms, a)
	}
	w.await("Berth believes the stop", 3*time.Second, func() bool { return hostStatus(w.status(), "host-a").LiveVMs == 0 })

	w.clearFault("host-a", "stop-leak") // the next stop really stops
	const unknown, foreign = "berth-999999-1", "someone-elses-vm"
	for _, vm := range []string{unknown, foreign} {
		if err := os.WriteFile(filepath.Join(w.faultDir("host-a"), "vms", vm), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	w.never("the VM stopped while the inventory cannot be read", 2500*time.Millisecond, func() bool {
		return w.calls("host-a", "stop", a).starts > 1
	})
	w.clearFault("host-a", "list-fail")
	w.await("the sweep stops the VM the host still counts and the unknown one", 10*time.Second, func() bool {
		return slices.Equal(w.vms("host-a"), []string{foreign})
	})
	if c := w.calls("host-a", "stop", unknown); c.starts != 1 {
		t.Errorf("the VM without a record was stopped %d times, want once", c.starts)
	}
	// The script removes the VM before it records its own end: wait for that.
	w.await("the sweep's stop ended", 5*time.Second, func() bool { return len(w.calls("host-a", "stop", a).statuses) >= 2 })
	if c := w.calls("host-a", "stop", a); c.starts != 2 || !slices.Equal(c.statuses, []string{"0", "0"}) {
		t.Errorf("stop calls %+v, want the lying one and the sweep's", c)
	}
	if n := len(w.facts(events.TypeAttemptStopped, a)); n != 1 {
		t.Errorf("%d stopped facts", n)
	}
	w.checkLedger()
}
