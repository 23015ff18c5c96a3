package watchdog_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/services/watchdog"
)

// benchFleet folds jobs over 10 hosts. In the "mix" shape 10% of the jobs are
// queued, 10% running and the rest completed but still retained (as they are
// for the retention, 72 h); in the "retained" shape all but one are
// completed; in the "running" shape all but one run, as in the bench's
// scale phase (10,000 running jobs), each binding recorded by the
// dispatcher; "wide" is "running" on a host for every 20 jobs (the scale
// phase's 500 hosts at 10,000 jobs) instead of 10. The watchdog decides
// after every batch and every tick.
func benchFleet(n int, shape string) *events.Fleet {
	f := events.NewFleet()
	var seq uint64
	add := func(ps ...events.Payload) {
		for _, p := range ps {
			seq++
			e := events.New("bench", t0.Add(time.Duration(seq)*time.Millisecond), p)
			e.Seq = seq
			testkit.ApplyGranted(f, e)
		}
	}
	hosts := 10
	if shape == "wide" {
		hosts, shape = max(n/20, 1), "running"
	}
	for i := 0; i < hosts; i++ {
		h := "h-" + strconv.Itoa(i)
		add(&events.HostOnline{Host: h, Boot: "b1", PhysicalCap: n/hosts + 10, CurveKey: "X" + h, Backend: "exec",
			Pools: map[string]events.PoolSlots{"linux": {Labels: linux, Slots: n/hosts + 10}}})
	}
	for i := 0; i < n; i++ {
		id, h := int64(i+1), "h-"+strconv.Itoa(i%hosts)
		switch {
		case shape == "mix" && i%10 == 0, shape == "retained" && i == 0:
			add(&events.JobQueued{JobRef: job(id)})
		case shape == "mix" && i%10 == 1, shape == "running":
			// The dispatcher records each binding on the attempt's
			// subject, as in a real fleet.
			add(running(id, h)...)
			add(&events.AttemptBound{AttemptRef: aref(id, h), JobID: id})
		default:
			r := aref(id, h)
			add(running(id, h)...)
			add(&events.JobCompleted{JobRef: job(id), RunnerName: r.Attempt, Conclusion: "success"},
				release(id, h, events.ReleaseCompleted),
				&events.AttemptTeardownRequested{AttemptRef: r, Reason: events.ReleaseCompleted},
				&events.AttemptStopped{AttemptRef: r})
		}
	}
	return f
}

func BenchmarkDecide(b *testing.B) {
	for _, shape := range []string{"mix", "retained", "running", "wide"} {
		for _, n := range []int{100, 1000, 10000} {
			b.Run(shape+"/jobs="+strconv.Itoa(n), func(b *testing.B) {
				f := benchFleet(n, shape)
				now := t0.Add(time.Duration(n) * time.Millisecond * 20)
				beats := map[string]time.Time{}
				for h := range f.Hosts {
					beats[h] = now
				}
				_ = watchdog.Decide(f, now, beats, params) // the first read builds the fold's indexes
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					_ = watchdog.Decide(f, now, beats, params)
				}
			})
		}
	}
}
