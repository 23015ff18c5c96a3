package dispatch_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/dispatch"
	"github.com/berth-ci/berth/services/testkit"
)

// benchFleet folds jobs over 10 hosts. In the "mix" shape 10% of the jobs are
// queued (demand), 10% running and the rest completed but still retained, as
// they are for the retention (72 h); in the "retained" shape all but one are
// completed; in the "running" shape all but one run (the scale phase: 10,000
// concurrent jobs); in the "backlog" shape 100 run and fill the fleet and
// the rest wait (issue 19: a round must not walk the backlog); in the
// "wide" shape all but one run on 500 hosts, one slot free on each, and
// the one queued job is booked (issue 19: a booking must not walk every
// host). Decide runs after every batch of facts, so its cost per call is
// what the dispatcher's loop pays per batch.
func benchFleet(n int, shape string) *events.Fleet {
	f := events.NewFleet()
	var seq uint64
	add := func(ps ...events.Payload) {
		for _, p := range ps {
			seq++
			e := events.New("bench", t0.Add(time.Duration(seq)*time.Millisecond), p)
			e.Seq = seq
			testkit.ApplyGranted(f, e) // a host takes bookings once granted
		}
	}
	hosts, slots := 10, n/10+10
	switch shape {
	case "backlog":
		slots = 10
	case "wide":
		hosts = 500
		slots = n/hosts + 1
	}
	for i := 0; i < hosts; i++ {
		add(host("h-"+strconv.Itoa(i), slots, slots))
	}
	for i := 0; i < n; i++ {
		id, h := int64(i+1), "h-"+strconv.Itoa(i%hosts)
		switch {
		case shape == "backlog" && i < 100:
			add(running(id, h)...)
		case shape == "backlog":
			add(queued(id))
		case shape == "mix" && i%10 == 0, shape != "mix" && i == 0:
			add(queued(id))
		case shape == "mix" && i%10 == 1, shape == "running", shape == "wide":
			add(running(id, h)...)
		default:
			add(done(id, h, "success")...)
		}
	}
	// The dispatcher's own records of what runs where (bound facts), as a
	// log in steady state holds them: without them every round would plan
	// them again, which is the first round's cost, not a round's.
	for _, b := range dispatch.Decide(f, params).Bound {
		add(&b)
	}
	return f
}

func BenchmarkDecide(b *testing.B) {
	for _, shape := range []string{"mix", "retained", "running", "backlog", "wide"} {
		for _, n := range []int{100, 1000, 10000} {
			if shape == "wide" && n < 1000 {
				continue // 500 hosts
			}
			b.Run(shape+"/jobs="+strconv.Itoa(n), func(b *testing.B) {
				f := benchFleet(n, shape)
				// Every shape but the backlog has room for its queued
				// jobs: each round books them (the plan is not applied).
				if got := len(dispatch.Decide(f, params).Reserve); shape != "backlog" && got == 0 {
					b.Fatal("no booking planned: the rounds measured would book nothing")
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					_ = dispatch.Decide(f, params)
				}
			})
		}
	}
}
