package page

import (
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
)

// Given a pool whose held slots change every second for three hours,
// then the page keeps at most two samples per period of the last hour
// (law 5: flat in time and jobs), the oldest no older than the window,
// and the newest is the last change.
func TestHistoryIsBoundedToTheWindow(t *testing.T) {
	h := newHistory(10 * time.Second)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var now time.Time
	for i := 0; i < 3*3600; i++ {
		now = t0.Add(time.Duration(i) * time.Second)
		h.add(events.Status{Pools: []events.PoolStatus{{Name: "linux", Held: i % 7, PendingDemand: i % 3}}}, now)
	}
	got := h.of("linux")
	if limit := 2 * int(Window/(10*time.Second)); len(got) > limit+1 {
		t.Fatalf("%d samples kept, want at most %d", len(got), limit+1)
	}
	if age := now.Sub(got[0].At); age > Window {
		t.Errorf("oldest sample %s old, want within %s", age, Window)
	}
	if last := got[len(got)-1]; last.Held != (3*3600-1)%7 {
		t.Errorf("newest sample %+v, want the last change", last)
	}
	h.add(events.Status{}, now)
	if len(h.of("linux")) != 0 {
		t.Error("a pool gone from the status keeps its samples")
	}
}
