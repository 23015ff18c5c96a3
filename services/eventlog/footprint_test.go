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
// embedded server and its nats.go subscription included (about 90 KiB in
// all, the buffer of decoded facts 20 KiB of that). That buffer is scanned
// by the garbage collector on every cycle, used or not: at 1,024 slots it
// alone was 160 KiB a loop (about 230 KiB in all), and for the bench's 500
// agents most of 65 MiB, which lengthened every mark phase.
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
		t.Fatalf("an idle loop holds %d B of heap, want at most 128 KiB: look at what grew with a heap profile of this test: the loop's buffers (followBuffer, the pull batch), nats.go's subscription, or the server's consumer after a NATS upgrade", per)
	}
}
