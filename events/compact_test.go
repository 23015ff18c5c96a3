package events_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
)

// Jobs 4 and 6 completed long ago but their attempts are still live (an
// abandoned VM, a leaked slot): dropping the job would unbind the attempt
// (BoundJob 0) and the status would misreport a leaked slot as provisioning.
func TestCompactDropsOldTerminalRecordsAndKeepsLiveOnes(t *testing.T) {
	day := 24 * 3600
	old := ref("berth-1-1", "linux", "h1")    // job 1: done long ago
	live := ref("berth-2-1", "linux", "h1")   // job 2: running now
	recent := ref("berth-3-1", "linux", "h1") // job 3: done an hour ago
	stuck := ref("berth-4-1", "linux", "h1")  // job 4: done long ago, VM abandoned, never stopped
	minted := ref("berth-5-1", "linux", "h1") // job 5: cancelled long ago, mint failed, never placed
	leak := ref("berth-6-1", "linux", "h1")   // job 6: done long ago, its slot never released
	f := given(
		ev(1, 0, hostOnline("h1", 8, map[string]int{"linux": 4})),
		ev(2, 1, &events.JobQueued{JobRef: job(1, "linux")}),
		ev(3, 2, reserve(old.Attempt, "linux", "h1", 1)),
		ev(4, 3, &events.AttemptPlaced{AttemptRef: old, JobID: 1}),
		ev(5, 4, &events.AttemptProvisioning{AttemptRef: old}),
		ev(6, 5, &events.JobCompleted{JobRef: job(1, "linux"), RunnerName: old.Attempt}),
		ev(7, 6, release(old.Attempt, "linux", "h1", events.ReleaseCompleted)),
		ev(8, 7, &events.AttemptStopped{AttemptRef: old}),

		ev(9, 8, reserve(stuck.Attempt, "linux", "h1", 4)),
		ev(10, 9, &events.AttemptPlaced{AttemptRef: stuck, JobID: 4}),
		ev(11, 10, &events.AttemptProvisioning{AttemptRef: stuck}),
		ev(12, 11, &events.JobCompleted{JobRef: job(4, "linux"), RunnerName: stuck.Attempt}),
		ev(13, 12, release(stuck.Attempt, "linux", "h1", events.ReleaseCompleted)),
		ev(14, 13, &events.AttemptAbandoned{AttemptRef: stuck, Step: "stop"}),

		ev(15, 14, &events.JobQueued{JobRef: job(5, "linux")}),
		ev(16, 15, reserve(minted.Attempt, "linux", "h1", 5)),
		ev(17, 16, &events.JobCompleted{JobRef: job(5, "linux"), Conclusion: "cancelled"}),
		ev(18, 17, release(minted.Attempt, "linux", "h1", events.ReleaseMintFailed)),

		ev(19, 18, reserve(leak.Attempt, "linux", "h1", 6)),
		ev(20, 19, &events.AttemptPlaced{AttemptRef: leak, JobID: 6}),
		ev(21, 20, &events.AttemptProvisioning{AttemptRef: leak}),
		ev(22, 21, &events.JobCompleted{JobRef: job(6, "linux"), RunnerName: leak.Attempt}),

		ev(30, 9*day, &events.JobQueued{JobRef: job(2, "linux")}),
		ev(31, 9*day, reserve(live.Attempt, "linux", "h1", 2)),
		ev(32, 9*day, &events.AttemptPlaced{AttemptRef: live, JobID: 2}),
		ev(33, 9*day, &events.AttemptProvisioning{AttemptRef: live}),
		ev(34, 9*day, &events.JobInProgress{JobRef: job(2, "linux"), RunnerName: live.Attempt}),
		ev(35, 10*day-3600, &events.JobCompleted{JobRef: job(3, "linux"), RunnerName: recent.Attempt}),
		ev(36, 10*day-3600, reserve(recent.Attempt, "linux", "h1", 3)),
		ev(37, 10*day-3600, release(recent.Attempt, "linux", "h1", events.ReleaseCompleted)),
	)
	before := f.Status()
	// Settling no sooner than the retention: what this test checks is
	// what the retention drops (TestSettledJobLeavesOnlyItsID checks
	// settling).
	jobs, attempts := f.CompactAfter(t0.Add(10*24*time.Hour), 4*24*time.Hour, 4*24*time.Hour)
	if jobs != 2 || attempts != 2 {
		t.Fatalf("Compact dropped %d jobs, %d attempts; want 2 jobs (1, 5), 2 attempts (%s, %s)",
			jobs, attempts, old.Attempt, minted.Attempt)
	}
	for _, id := range []int64{1, 5} {
		if _, ok := f.Jobs[id]; ok {
			t.Errorf("job %d survived compaction", id)
		}
	}
	for _, id := range []int64{2, 3, 4, 6} {
		if _, ok := f.Jobs[id]; !ok {
			t.Errorf("job %d was dropped but is recent or has a live attempt", id)
		}
	}
	for _, a := range []string{live.Attempt, recent.Attempt, stuck.Attempt, leak.Attempt} {
		if _, ok := f.Attempts[a]; !ok {
			t.Errorf("attempt %s was dropped but is live or recent", a)
		}
	}
	if f.BoundJob(old.Attempt) != 0 || f.BoundJob(live.Attempt) != 2 ||
		f.BoundJob(stuck.Attempt) != 4 || f.BoundJob(leak.Attempt) != 6 {
		t.Fatalf("bindings after compaction: old %d live %d stuck %d leak %d", f.BoundJob(old.Attempt),
			f.BoundJob(live.Attempt), f.BoundJob(stuck.Attempt), f.BoundJob(leak.Attempt))
	}
	after := f.Status()
	after.Jobs, before.Jobs = events.JobCounts{}, events.JobCounts{}
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("compaction changed what operators see beyond job counts:\nbefore %+v\n after %+v", before, after)
	}
	if vs := f.Check(); len(vs) != 0 {
		t.Fatalf("violations after compaction %v", vs)
	}
}
