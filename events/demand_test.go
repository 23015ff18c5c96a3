package events_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"pgregory.net/rapid"
)

// Given random job facts (a job queued again with an earlier time, taken,
// taken by a runner bound to another job, given up on, completed), hosts
// announcing other labels for their pools, and compactions, in any order,
// the demand the fold keeps per pool, oldest first, and the pool labels it
// keeps, and the hosts with room per pool, equal what a full scan of the
// fold finds after every step (issue 19: a decision reads these instead of
// walking the backlog and the hosts).
func TestPropertyDecisionIndexesEqualAFullScan(t *testing.T) {
	labelSets := [][]string{{"self-hosted", "linux"}, {"linux"}, {"self-hosted", "macos"}, {"self-hosted", "linux", "gpu"}, {"Linux", "SELF-HOSTED"}, nil}
	rapid.Check(t, func(t *rapid.T) {
		f := events.NewFleet()
		var seq uint64
		add := func(sec int, p events.Payload) {
			seq++
			e := events.New("test", t0.Add(time.Duration(sec)*time.Second), p)
			e.Seq = seq
			f.Apply(e)
		}
		jobs := rapid.IntRange(1, 12).Draw(t, "jobs")
		for i, n := 0, rapid.IntRange(1, 80).Draw(t, "steps"); i < n; i++ {
			id := int64(rapid.IntRange(1, jobs).Draw(t, "job"))
			sec := rapid.IntRange(0, 100).Draw(t, "at")
			r := events.JobRef{JobID: id, RunID: 1, Labels: labelSets[rapid.IntRange(0, len(labelSets)-1).Draw(t, "labels")],
				Delivery: fmt.Sprintf("d-%d", seq+1)}
			runner := fmt.Sprintf("r-%d", rapid.IntRange(1, 4).Draw(t, "runner"))
			host := fmt.Sprintf("h-%d", rapid.IntRange(1, 3).Draw(t, "host"))
			pool := []string{"linux", "macos", "gpu"}[rapid.IntRange(0, 2).Draw(t, "pool")]
			ar := events.AttemptRef{Attempt: fmt.Sprintf("a-%d", rapid.IntRange(1, 8).Draw(t, "attempt")), Pool: pool, Host: host}
			switch rapid.IntRange(0, 14).Draw(t, "fact") {
			case 9:
				add(sec, &events.SlotReserved{Pool: pool, Host: host, Attempt: ar.Attempt, JobID: id, N: 1})
			case 10:
				add(sec, &events.SlotReleased{Pool: pool, Host: host, Attempt: ar.Attempt, JobID: id, Reason: events.ReleaseSurplus})
			case 11:
				add(sec, &events.AttemptProvisioning{AttemptRef: ar})
			case 12:
				add(sec, &events.AttemptStopped{AttemptRef: ar})
			case 13:
				add(sec, &events.HostCordoned{HostChange: events.HostChange{Host: host, Reason: "test"}})
			case 14:
				switch rapid.IntRange(0, 2).Draw(t, "host change") {
				case 0:
					add(sec, &events.HostUncordoned{HostChange: events.HostChange{Host: host}})
				case 1:
					add(sec, &events.HostDraining{HostChange: events.HostChange{Host: host}})
				case 2:
					add(sec, &events.HostLost{HostChange: events.HostChange{Host: host}})
				}
			case 0, 1, 2:
				add(sec, &events.JobQueued{JobRef: r})
			case 3:
				add(sec, &events.JobWaiting{JobRef: r})
			case 4:
				add(sec, &events.JobInProgress{JobRef: r, RunnerName: runner})
			case 5:
				add(sec, &events.JobCompleted{JobRef: r, RunnerName: runner, Conclusion: "success"})
			case 6:
				add(sec, &events.JobUnschedulable{JobID: id, Reason: "test"})
			case 7:
				pools := map[string]events.PoolSlots{}
				for _, name := range []string{"linux", "macos", "gpu"} {
					if rapid.Bool().Draw(t, "offers "+name) {
						pools[name] = events.PoolSlots{Labels: labelSets[rapid.IntRange(0, 3).Draw(t, name+" labels")], Slots: rapid.IntRange(0, 2).Draw(t, "slots")}
					}
				}
				o := events.HostOnline{Host: host, Boot: fmt.Sprintf("boot-%d", seq), PhysicalCap: rapid.IntRange(0, 3).Draw(t, "physical"), CurveKey: "X" + host, Backend: "exec", Pools: pools}
				g := events.GrantClaim(o)
				add(sec, &o)
				add(sec, &g)
			case 8:
				f.Compact(t0.Add(time.Duration(sec)*time.Second), time.Duration(rapid.IntRange(0, 60).Draw(t, "retention s"))*time.Second)
			}
			if rapid.IntRange(0, 3).Draw(t, "read") == 0 {
				requireDemandIndexed(t, f, i+1)
			}
		}
		requireDemandIndexed(t, f, -1)
	})
}
