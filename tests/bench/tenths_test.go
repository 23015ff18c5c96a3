package bench

import (
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/testkit"
)

// Given /proc/stat's first line, then the busy ticks are user, nice,
// system, irq, softirq and steal; idle, iowait and guest are not counted.
func TestMachineCPUCountsTheBusyFieldsOfProcStat(t *testing.T) {
	//                 user nice sys idle iowait irq softirq steal guest guest_nice
	line := "cpu  100 2 30 9000 400 5 6 7 50 0\n"
	if got, want := busyTicks(line), time.Duration(100+2+30+5+6+7); got != want {
		t.Fatalf("busy ticks = %d, want %d", got, want)
	}
	if got := busyTicks("cpu0 1 2 3 4 5 6 7 8 9 10"); got != 0 {
		t.Fatalf("a single core's line counted as the machine's: %d", got)
	}
}

// Given a run of 100 jobs profiled a tenth at a time, when its slots are
// released ten at a time, then each tenth is cut at its boundary with a
// profile of its own, the last one at the last release (before any stop),
// and the profiles merge.
func TestARunIsProfiledATenthAtATime(t *testing.T) {
	c := &Counter{counts: map[string]int64{}}
	tp := profileTenths(c, 100)
	if tp == nil {
		t.Skip("the CPU profile is taken by the test binary's -cpuprofile")
	}
	for k := int64(1); k <= 9; k++ {
		c.mu.Lock()
		c.counts[events.TypeSlotReleased] = 10 * k
		c.mu.Unlock()
		testkit.Eventually(t, 10*time.Second, "the watcher cuts the tenth", func() bool {
			tp.mu.Lock()
			defer tp.mu.Unlock()
			if len(tp.done) > int(k) {
				t.Fatalf("after %d released: %d tenths cut, want %d", 10*k, len(tp.done), k)
			}
			return len(tp.done) == int(k)
		})
	}
	c.mu.Lock()
	c.counts[events.TypeSlotReleased] = 100
	c.mu.Unlock()
	testkit.Eventually(t, 10*time.Second, "the watcher ends the last tenth at the last release", func() bool {
		tp.mu.Lock()
		defer tp.mu.Unlock()
		return len(tp.done) == 10
	})
	parts := tp.Stop()
	if len(parts) != 10 {
		t.Fatalf("%d tenths, want 10", len(parts))
	}
	for i, p := range parts {
		if want := int64(10 * (i + 1)); p.Released != want {
			t.Errorf("tenth %d ended at %d released, want %d", i+1, p.Released, want)
		}
		if len(p.Profile) == 0 {
			t.Errorf("tenth %d has no profile", i+1)
		}
	}
	if _, _, err := readTenths(parts, t.TempDir()+"/cpu.pprof"); err != nil {
		t.Fatal(err)
	}
}
