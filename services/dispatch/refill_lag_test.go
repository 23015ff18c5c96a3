package dispatch

import (
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Given a warm pool with target 2 and one idle VM, the refill lag gauge
// counts from when the pool was first seen short (fake clock), shows the
// target, and goes back to 0 once the pool has its 2 idle VMs.
func TestRefillLagCountsWhileThePoolIsShort(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	f := events.NewFleet()
	t0 := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	seq := uint64(0)
	add := func(ps ...events.Payload) {
		for _, p := range ps {
			seq++
			e := events.New("test", t0, p)
			e.Seq = seq
			f.Apply(e)
		}
	}
	idleVM := func(n int) {
		id := events.WarmAttemptID("linux", n)
		r := events.AttemptRef{Attempt: id, Pool: "linux", Host: "h-a"}
		add(&events.SlotReserved{Pool: "linux", Host: "h-a", Attempt: id, N: n, Warm: true},
			&events.AttemptPlaced{AttemptRef: r, Warm: true}, &events.AttemptProvisioning{AttemptRef: r}, &events.AttemptReady{AttemptRef: r})
	}
	add(&events.HostOnline{Host: "h-a", Boot: "b", PhysicalCap: 4, CurveKey: "X", Assign: true,
		Pools: map[string]events.PoolSlots{"linux": {Labels: []string{"linux"}, Slots: 4}}})
	idleVM(1)
	warm := map[string]WarmPool{"linux": {MinIdle: 2}}
	lag := func() float64 { return testutil.ToFloat64(m.refillLag.WithLabelValues("linux")) }

	m.observe(f, warm, t0)
	if got := testutil.ToFloat64(m.warmTarget.WithLabelValues("linux")); got != 2 {
		t.Fatalf("target gauge %v, want 2", got)
	}
	if lag() != 0 {
		t.Fatalf("lag %v when first seen short, want 0", lag())
	}
	m.observe(f, warm, t0.Add(30*time.Second))
	if lag() != 30 {
		t.Fatalf("lag %v after 30 s short, want 30", lag())
	}
	idleVM(2)
	m.observe(f, warm, t0.Add(40*time.Second))
	if lag() != 0 {
		t.Fatalf("lag %v at target, want 0", lag())
	}
}
