package events_test

import (
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"pgregory.net/rapid"
)

// Given a job that ran and ended, when Compact runs after it settled, then
// only its id and its attempt's id are left; a redelivered webhook and a
// late duplicate of its facts change nothing (no demand, no slot, no
// record), the operators' job counts still count it, a snapshot keeps the
// ids, and the retention drops them (issue 19).
func TestSettledJobLeavesOnlyItsID(t *testing.T) {
	a := ref("berth-1-1", "linux", "h1")
	queued := ev(2, 1, &events.JobQueued{JobRef: job(1, "self-hosted", "linux")})
	release := ev(8, 7, release(a.Attempt, "linux", "h1", events.ReleaseCompleted))
	f := given(
		ev(1, 0, hostOnline("h1", 8, map[string]int{"linux": 4})),
		queued,
		ev(3, 2, reserve(a.Attempt, "linux", "h1", 1)),
		ev(4, 3, &events.AttemptPlaced{AttemptRef: a, JobID: 1, RunnerID: 9}),
		ev(5, 4, &events.AttemptProvisioning{AttemptRef: a}),
		ev(6, 5, &events.JobInProgress{JobRef: job(1, "self-hosted", "linux"), RunnerName: a.Attempt}),
		ev(7, 6, &events.JobCompleted{JobRef: job(1, "self-hosted", "linux"), RunnerName: a.Attempt, Conclusion: "success"}),
		release,
		ev(9, 8, &events.AttemptTeardownRequested{AttemptRef: a, Reason: events.ReleaseCompleted}),
		ev(10, 9, &events.AttemptStopped{AttemptRef: a}),
	)
	before := f.Status()

	if jobs, attempts := f.Compact(t0.Add(events.DefaultSettleAfter/2), 72*time.Hour); jobs != 0 || attempts != 0 {
		t.Fatalf("Compact half DefaultSettleAfter after the end dropped %d jobs, %d attempts; want none before DefaultSettleAfter", jobs, attempts)
	}
	if jobs, attempts := f.Compact(t0.Add(time.Hour), 72*time.Hour); jobs != 1 || attempts != 1 {
		t.Fatalf("Compact an hour after the end settled %d jobs, %d attempts; want 1 and 1", jobs, attempts)
	}
	if f.Jobs[1] != nil || f.Attempts[a.Attempt] != nil || !f.Settled(1) || !f.SettledAttempt(a.Attempt) || !f.KnownJob(1) {
		t.Fatalf("after settling: job record %v, attempt record %v, settled %v/%v", f.Jobs[1], f.Attempts[a.Attempt], f.Settled(1), f.SettledAttempt(a.Attempt))
	}
	if after := f.Status(); !reflect.DeepEqual(before, after) {
		t.Fatalf("settling changed what operators see:\nbefore %+v\n after %+v", before, after)
	}

	redelivered := queued
	redelivered.Seq = 11
	late := release
	late.Seq = 12
	f.Apply(redelivered)
	f.Apply(late)
	f.Apply(ev(13, 3700, &events.AttemptStopped{AttemptRef: a}))
	if f.Jobs[1] != nil || f.Attempts[a.Attempt] != nil || f.DemandCount("linux") != 0 || f.Pools["linux"].Held != 0 || f.Hosts["h1"].Held["linux"] != 0 {
		t.Fatalf("late facts about a settled job: job %v attempt %v demand %d held %d", f.Jobs[1], f.Attempts[a.Attempt], f.DemandCount("linux"), f.Pools["linux"].Held)
	}
	if f.Pools["linux"].LastSeq != 12 {
		t.Fatalf("a late release on the pool's ledger must still move its sequence: %d, want 12", f.Pools["linux"].LastSeq)
	}
	if vs := f.Check(); len(vs) != 0 {
		t.Fatalf("violations %v", vs)
	}

	b, err := events.MarshalSnapshot(f)
	if err != nil {
		t.Fatal(err)
	}
	g, err := events.UnmarshalSnapshot(b)
	if err != nil {
		t.Fatal(err)
	}
	if !g.Settled(1) || !g.SettledAttempt(a.Attempt) {
		t.Fatal("a snapshot lost the settled ids")
	}

	f.Compact(t0.Add(73*time.Hour), 72*time.Hour)
	if f.Settled(1) || f.SettledAttempt(a.Attempt) {
		t.Fatal("the retention did not drop the settled ids")
	}
}

// Given a fleet that ran KeepOver+3 jobs within a few minutes, when it compacts
// a second after the last ended, then the three oldest leave only their
// ids and the newest KeepOver keep their records (the page shows them),
// though none is over for DefaultSettleAfter, nor for a minute; the counts
// are unchanged; and a fleet of KeepOver jobs keeps every record (issue 19:
// a busy fleet keeps KeepOver records over, whatever its rate).
func TestABusyFleetKeepsTheRecordsOfItsNewestJobsOver(t *testing.T) {
	ran := func(n int) (*events.Fleet, time.Time) {
		evs := lifecycles(&fastScript{}, 1, n)
		return given(evs...), evs[len(evs)-1].Time
	}
	f, end := ran(events.KeepOver + 3)
	before := f.StatusCounts()
	if jobs, attempts := f.Compact(end.Add(time.Second), 72*time.Hour); jobs != 3 || attempts != 3 {
		t.Fatalf("Compact settled %d jobs and %d attempts; want the 3 oldest of each", jobs, attempts)
	}
	for id := int64(1); id <= 3; id++ {
		if !f.Settled(id) || f.Jobs[id] != nil {
			t.Fatalf("job %d, among the oldest, kept its record", id)
		}
	}
	if f.Settled(4) || f.Jobs[4] == nil || len(f.Jobs) != events.KeepOver {
		t.Fatalf("the newest %d jobs must keep their records: %d kept, job 4's %v", events.KeepOver, len(f.Jobs), f.Jobs[4])
	}
	if after := f.StatusCounts(); !reflect.DeepEqual(before, after) {
		t.Fatalf("settling early changed what operators see:\nbefore %+v\n after %+v", before, after)
	}
	g, end := ran(events.KeepOver)
	if jobs, attempts := g.Compact(end.Add(time.Second), 72*time.Hour); jobs != 0 || attempts != 0 {
		t.Fatalf("a fleet of %d jobs settled %d jobs and %d attempts before DefaultSettleAfter; want none", events.KeepOver, jobs, attempts)
	}
}

// lifecycles is a host of the linux pool, then jobs first..last from queued
// to their VM's stop, one after another, written by s.
func lifecycles(s *fastScript, first, last int) []events.Event {
	var evs []events.Event
	if first == 1 {
		evs = append(evs, s.add(hostOnline("h1", 8, map[string]int{"linux": 4})))
	}
	for i := first; i <= last; i++ {
		id := int64(i)
		a := ref("berth-"+strconv.Itoa(i)+"-1", "linux", "h1")
		evs = append(evs,
			s.add(&events.JobQueued{JobRef: job(id, "self-hosted", "linux")}),
			s.add(reserve(a.Attempt, "linux", "h1", id)),
			s.add(&events.AttemptPlaced{AttemptRef: a, JobID: id, RunnerID: id}),
			s.add(&events.JobInProgress{JobRef: job(id, "self-hosted", "linux"), RunnerName: a.Attempt}),
			s.add(&events.JobCompleted{JobRef: job(id, "self-hosted", "linux"), RunnerName: a.Attempt, Conclusion: "success"}),
			s.add(release(a.Attempt, "linux", "h1", events.ReleaseCompleted)),
			s.add(&events.AttemptTeardownRequested{AttemptRef: a, Reason: events.ReleaseCompleted}),
			s.add(&events.AttemptStopped{AttemptRef: a}),
		)
	}
	return evs
}

// Given a fleet compacted once, when it folds fewer than KeepOver more
// records, then no compaction is due before CompactEvery; once it holds
// KeepOver more than the compaction left, one is due from CompactSoonest
// on (not before); after that compaction, what is left is KeepOver
// records over, and none is due again until the fold grows by KeepOver
// more; and a fold grown only by live jobs compacts once for them, then
// waits (issue 19: a busy fleet's folds follow KeepOver, not its rate).
func TestACompactionIsDueSoonerOnceTheFoldGrewByKeepOver(t *testing.T) {
	s := &fastScript{}
	n := events.KeepOver + 10
	f := given(lifecycles(s, 1, n)...)
	// The facts' times matter to what a compaction settles, not to when one
	// is due: that is judged from the last compaction, at.
	compact := func() { f.Compact(t0.Add(time.Duration(s.n+20)*50*time.Millisecond), 72*time.Hour) }
	at := t0.Add(time.Hour)
	compact()
	if f.CompactDue(at.Add(events.CompactSoonest), at) {
		t.Fatal("due after CompactSoonest with the fold as the compaction left it")
	}
	if !f.CompactDue(at.Add(events.CompactEvery), at) {
		t.Fatal("not due after CompactEvery")
	}
	grow := func(evs []events.Event) {
		for _, e := range evs {
			f.Apply(e)
		}
	}
	if len(f.Jobs) != events.KeepOver {
		t.Fatalf("the first compaction left %d jobs; want the newest %d", len(f.Jobs), events.KeepOver)
	}
	grow(lifecycles(s, n+1, n+events.KeepOver/2-1)) // a job and an attempt each: KeepOver-2 records
	if f.CompactDue(at.Add(events.CompactSoonest), at) {
		t.Fatalf("due with %d records, fewer than KeepOver more than the compaction left", len(f.Jobs)+len(f.Attempts))
	}
	grow(lifecycles(s, n+events.KeepOver/2, n+events.KeepOver/2))
	if f.CompactDue(at.Add(events.CompactSoonest-time.Millisecond), at) {
		t.Fatal("due before CompactSoonest")
	}
	if !f.CompactDue(at.Add(events.CompactSoonest), at) {
		t.Fatalf("not due with %d records, KeepOver more than the compaction left", len(f.Jobs)+len(f.Attempts))
	}
	compact()
	if len(f.Jobs) != events.KeepOver || len(f.Attempts) != events.KeepOver {
		t.Fatalf("the compaction left %d jobs and %d attempts; want the newest %d of each", len(f.Jobs), len(f.Attempts), events.KeepOver)
	}
	if f.CompactDue(at.Add(events.CompactSoonest), at) {
		t.Fatal("due again with the fold as the compaction left it")
	}
	for i := range events.KeepOver {
		f.Apply(s.add(&events.JobQueued{JobRef: job(int64(100_000+i), "self-hosted", "gpu")}))
	}
	if !f.CompactDue(at.Add(events.CompactSoonest), at) {
		t.Fatal("not due after KeepOver queued jobs")
	}
	compact()
	if f.CompactDue(at.Add(events.CompactSoonest), at) {
		t.Fatal("due again with only live jobs added: they cannot settle")
	}
}

// fastScript numbers facts in the order they are written: seq n at t0 +
// n × 50 ms, so a thousand jobs' facts fit in DefaultSettleAfter.
type fastScript struct{ n uint64 }

func (s *fastScript) add(p events.Payload) events.Event {
	s.n++
	e := events.New("test", t0.Add(time.Duration(s.n)*50*time.Millisecond), p)
	e.Seq = s.n
	return e
}

// Given any valid history with redeliveries of earlier facts mixed in, a
// fold that settles what is over (at random points, after a random settling
// time) decides exactly as one that keeps every record: the same live jobs
// and attempts, demand, room, counters and status, and every record it
// still holds equals the full fold's (issue 19: a tombstone makes a
// redelivery or a late fact harmless and changes nothing else).
func TestPropertySettlingChangesNoDecision(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := genHistory(t)
		full, settled := events.NewFleet(), events.NewFleet()
		var now time.Time
		for i := 0; i < len(h); i++ {
			if h[i].Time.After(now) {
				now = h[i].Time
			}
			full.Apply(h[i])
			settled.Apply(h[i])
			if rapid.IntRange(0, 3).Draw(t, "redeliver") == 0 {
				e := h[rapid.IntRange(0, i).Draw(t, "redelivered")] // stored again later
				full.Apply(e)
				settled.Apply(e)
			}
			if rapid.IntRange(0, 3).Draw(t, "compact") == 0 {
				after, keep := rapid.IntRange(0, 60).Draw(t, "settle s"), rapid.IntRange(0, 3).Draw(t, "keep")
				settled.CompactKeeping(now, time.Duration(after)*time.Second, keep, 1000*time.Hour)
			}
			requireSameDecisions(t, settled, full, i)
		}
	})
}

func requireSameDecisions(t *rapid.T, got, want *events.Fleet, step int) {
	ids := func(f *events.Fleet) (jobs []int64, live, unquiet, vms []string) {
		for j := range f.OpenJobs() {
			jobs = append(jobs, j.ID)
		}
		for a := range f.LiveAttempts() {
			live = append(live, a.ID)
		}
		for a := range f.UnquietAttempts() {
			unquiet = append(unquiet, a.ID)
		}
		for a := range f.VMAttempts() {
			vms = append(vms, a.ID)
		}
		slices.Sort(jobs)
		slices.Sort(live)
		slices.Sort(unquiet)
		slices.Sort(vms)
		return
	}
	gj, gl, gu, gv := ids(got)
	wj, wl, wu, wv := ids(want)
	if !reflect.DeepEqual([][]string{gl, gu, gv}, [][]string{wl, wu, wv}) || !reflect.DeepEqual(gj, wj) {
		t.Fatalf("step %d: live jobs %v attempts %v unquiet %v vms %v; the full fold: %v %v %v %v", step, gj, gl, gu, gv, wj, wl, wu, wv)
	}
	for pool := range want.PoolLabels() {
		if got.DemandCount(pool) != want.DemandCount(pool) {
			t.Fatalf("step %d: pool %s demand %d, the full fold %d", step, pool, got.DemandCount(pool), want.DemandCount(pool))
		}
	}
	if gs, ws := got.Status(), want.Status(); !reflect.DeepEqual(gs, ws) {
		t.Fatalf("step %d: status\n got %+v\nwant %+v", step, gs, ws)
	}
	for id, j := range got.Jobs {
		if !reflect.DeepEqual(j, want.Jobs[id]) {
			t.Fatalf("step %d: job %d is %+v, in the full fold %+v", step, id, j, want.Jobs[id])
		}
	}
	for id, a := range got.Attempts {
		if !reflect.DeepEqual(a, want.Attempts[id]) {
			t.Fatalf("step %d: attempt %s is %+v, in the full fold %+v", step, id, a, want.Attempts[id])
		}
	}
	for name, h := range got.Hosts {
		w := want.Hosts[name]
		if !reflect.DeepEqual(h.Held, w.Held) || h.Booked != w.Booked || h.LiveVMs != w.LiveVMs || h.AbandonedVMs != w.AbandonedVMs {
			t.Fatalf("step %d: host %s counters differ from the full fold's", step, name)
		}
	}
	if vs := got.Check(); len(vs) != 0 {
		t.Fatalf("step %d: violations %v", step, vs)
	}
}

// Given job facts carrying GitHub delivery ids, when they settle, then a
// UUID in GitHub's form leaves the map for the packed set and is still
// found, exactly (an id differing in one digit, or in case, is not); other
// ids stay as they are; a snapshot keeps both; and GitHub's redelivery
// window drops them.
func TestSettledDeliveryIDsStayExact(t *testing.T) {
	const id = "72d3162e-cc78-11e3-81ab-4c9367dc0958"
	f := events.NewFleet()
	for i, d := range []string{id, "4c9367dc-0958-11e3-81ab-72d3162ecc78", "not-a-uuid"} {
		r := job(int64(i+1), "linux")
		r.Delivery = d
		f.Apply(ev(uint64(i+1), i, &events.JobQueued{JobRef: r}))
	}
	f.Compact(t0.Add(time.Hour), 72*time.Hour)
	if _, inMap := f.Deliveries[id]; inMap || len(f.Deliveries) != 1 {
		t.Fatalf("after settling the map holds %v; want only the id that is no UUID", f.Deliveries)
	}
	b, err := events.MarshalSnapshot(f)
	if err != nil {
		t.Fatal(err)
	}
	g, err := events.UnmarshalSnapshot(b)
	if err != nil {
		t.Fatal(err)
	}
	for _, fl := range []*events.Fleet{f, g} {
		for _, d := range []string{id, "4c9367dc-0958-11e3-81ab-72d3162ecc78", "not-a-uuid"} {
			if !fl.DeliveryStored(d) {
				t.Fatalf("delivery %s is not found after settling (or a snapshot)", d)
			}
		}
		for _, d := range []string{"72d3162e-cc78-11e3-81ab-4c9367dc0959", "72D3162E-CC78-11E3-81AB-4C9367DC0958", "72d3162ecc7811e381ab4c9367dc0958"} {
			if fl.DeliveryStored(d) {
				t.Fatalf("delivery %s is found but was never stored", d)
			}
		}
	}
	f.Compact(t0.Add(events.DeliveryMemory+time.Hour), time.Hour)
	if f.DeliveryStored(id) || f.DeliveryStored("not-a-uuid") {
		t.Fatal("delivery ids kept past GitHub's redelivery window")
	}
}
