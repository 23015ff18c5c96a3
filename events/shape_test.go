package events_test

import (
	"strings"
	"testing"

	"github.com/berth-ci/berth/events"
)

// shapedHost is a host with 12 CPUs and 32 GiB shared by pool linux (2 CPU,
// 4 GiB) and its shape l (8 CPU, 16 GiB, runner label berth-size-l).
func shapedHost() *events.HostOnline {
	return &events.HostOnline{Host: "h", Boot: "b", PhysicalCap: 10, Backend: "exec", CurveKey: "X",
		Resources: &events.Resources{CPU: 12, MemoryMiB: 32 << 10},
		Pools: map[string]events.PoolSlots{
			"linux":   {Labels: []string{"self-hosted", "linux"}, Slots: 8, Shape: &events.Shape{CPU: 2, MemoryMiB: 4 << 10}},
			"linux-l": {Labels: []string{"self-hosted", "linux", "berth-size-l"}, Slots: 8, Shape: &events.Shape{CPU: 8, MemoryMiB: 16 << 10}},
		}}
}

// Given a host whose resources are counted by shape, when attempts of each
// shape are booked, stopped and released, then the fold counts the booked
// VMs per pool, and one more VM fits only while the shapes' CPUs and memory
// stay within the host's: one L (8 CPU) and two small (4 CPU) fill 12 CPUs.
func TestTheFoldCountsShapesAgainstTheHostsResources(t *testing.T) {
	var s script
	s.add(shapedHost())
	s.add(reserve("berth-1-1", "linux-l", "h", 1))
	f := given(s.evs...)
	h := f.Hosts["h"]
	if h.BookedIn["linux-l"] != 1 || h.Resources.CPU != 12 || h.Pools["linux-l"].Shape.CPU != 8 {
		t.Fatalf("booked %v, resources %+v, shape %+v", h.BookedIn, h.Resources, h.Pools["linux-l"].Shape)
	}
	if events.HostFits(h, "linux-l", nil) {
		t.Error("a second L (8+8 CPU) fits a 12-CPU host")
	}
	if !events.HostFits(h, "linux", nil) {
		t.Error("a small VM (8+2 CPU) does not fit a 12-CPU host")
	}
	extra := func(pool string) int {
		if pool == "linux" {
			return 2 // booked in the same round, not folded yet
		}
		return 0
	}
	if events.HostFits(h, "linux", extra) {
		t.Error("a third small VM (8+2+2+2 CPU) fits a 12-CPU host")
	}

	// When the L is released and its VM stopped, its resources come back.
	s.add(release("berth-1-1", "linux-l", "h", events.ReleaseCompleted))
	s.add(&events.AttemptStopped{AttemptRef: ref("berth-1-1", "linux-l", "h")})
	f = given(s.evs...)
	if h := f.Hosts["h"]; h.BookedIn["linux-l"] != 0 || !events.HostFits(h, "linux-l", nil) {
		t.Fatalf("after the stop: booked %v", h.BookedIn)
	}
	// The same history in reverse order folds to the same count.
	rev := make([]events.Event, len(s.evs))
	for i, e := range s.evs {
		rev[len(s.evs)-1-i] = e
	}
	if h := given(rev...).Hosts["h"]; h.BookedIn["linux-l"] != 0 {
		t.Fatalf("reversed: booked %v", h.BookedIn)
	}
}

// Given pools with shapes, a job whose shape label no pool offers is
// reported with the labels it asked for and the shapes on offer; a job
// with a known shape, a job with no shape label, and a job no pool serves
// at all are not "unknown shapes".
func TestAnUnknownShapeIsNamedNeverServedByTheDefault(t *testing.T) {
	pools := map[string][]string{
		"linux":       {"self-hosted", "linux"},
		"linux-l":     {"self-hosted", "linux", "berth-size-l"},
		"linux-xcode": {"self-hosted", "linux", "berth-image-xcode-16"},
	}
	reason, ok := events.UnknownShape([]string{"self-hosted", "linux", "berth-size-xxl"}, pools)
	if !ok || !strings.Contains(reason, "berth-size-xxl") || !strings.Contains(reason, "berth-size-l, berth-image-xcode-16") && !strings.Contains(reason, "berth-image-xcode-16, berth-size-l") {
		t.Fatalf("unknown shape: %q %v", reason, ok)
	}
	if events.MatchPool([]string{"self-hosted", "linux", "berth-size-xxl"}, pools) != "" {
		t.Fatal("an unknown shape matched a pool (the default?)")
	}
	// Two shape labels that no single shape has together are unknown too.
	if _, ok := events.UnknownShape([]string{"linux", "berth-size-l", "berth-image-xcode-16"}, pools); !ok {
		t.Error("size-l with image-xcode-16 (two different shapes) is not reported")
	}
	for _, labels := range [][]string{{"self-hosted", "linux", "berth-size-l"}, {"self-hosted", "linux"}, {"self-hosted", "windows", "berth-size-l"}} {
		if r, ok := events.UnknownShape(labels, pools); ok {
			t.Errorf("%v reported as an unknown shape: %s", labels, r)
		}
	}
	if p := events.MatchPool([]string{"self-hosted", "linux", "berth-size-l"}, pools); p != "linux-l" {
		t.Errorf("an L job matched %q, want linux-l", p)
	}
	if p := events.MatchPool([]string{"self-hosted", "linux"}, pools); p != "linux" {
		t.Errorf("a job with no shape label matched %q, want linux (the default shape)", p)
	}
}
