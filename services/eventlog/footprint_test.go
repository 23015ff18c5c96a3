package eventlog_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
)

// heapNow is the live heap after two forced collections, in bytes.
func heapNow() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// Given many loops following the log in one process (the bench's 500
// agents, or a host running agents side by side), when they are caught up
// and idle, then each costs at most 128 KiB of heap, its consumer in the
// embedded server included (about 40 KiB of it; the loop's own share is
// about 37 KiB, its buffer of decoded facts 21 KiB of that). That buffer is
// scanned by the garbage collector on every cycle, used or not: at 1,024
// slots it alone was 170 KiB a loop, and 74 MB for the bench's 500 agents,
// which lengthened every mark phase.
func TestAnIdleLoopCostsLittleHeap(t *testing.T) {
	_, js, app := start(t)
	appendQueued(t, app, "d-footprint", 1)
	const loops = 40
	before := heapNow()
	ls := make([]*eventlog.Loop, loops)
	for i := range ls {
		ls[i] = &eventlog.Loop{JS: js, Filters: []string{events.SubjectAll}, Tick: time.Hour,
			Consumer: &eventlog.Consumer{Name: fmt.Sprintf("test-footprint-%d", i)}}
		runLoop(t, ls[i], newDurableReactor())
	}
	testkit.Eventually(t, waitLimit, "every loop caught up", func() bool {
		for _, l := range ls {
			if !l.CaughtUp() {
				return false
			}
		}
		return true
	})
	after := heapNow()
	per := (int64(after) - int64(before)) / loops
	t.Logf("heap per idle loop: %d B (%d loops)", per, loops)
	if per > 128<<10 {
		t.Fatalf("an idle loop holds %d B of heap, want at most 128 KiB: look at its buffers (followBuffer, the consumer's pull batch)", per)
	}
}
