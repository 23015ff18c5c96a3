package events_test

import (
	"cmp"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"pgregory.net/rapid"
)

// projection is everything a fold exposes that must not depend on the order
// or multiplicity of facts (Applied and Skipped excluded).
type projection struct {
	Status   events.Status
	Attempts map[string]attemptView
	Jobs     map[int64]jobView
	Hosts    map[string]hostView
	Demand   map[string]time.Time
	LastSeq  uint64
}

type attemptView struct {
	Held, VMLive, Booked, Terminal bool
	Stage, ReleaseReason, Labels   string
	Releases                       int
	JobID, Bound                   int64
	LastAt                         time.Time
}

type jobView struct {
	Status                     events.JobStatus
	Runner, Conclusion, Labels string
	Minted, FailedAttempts     int
	Unschedulable              bool
	QueuedAt, CompletedAt      time.Time
}

type hostView struct {
	Booked, LiveVMs, AbandonedVMs, PhysicalCap int
	Cordoned                                   bool
	State                                      events.HostState
	Boot, CordonReason                         string
}

func project(f *events.Fleet) projection {
	p := projection{Status: f.Status(), Attempts: map[string]attemptView{}, Jobs: map[int64]jobView{},
		Hosts: map[string]hostView{}, Demand: f.DemandReported, LastSeq: f.LastSeq}
	p.Status.Skipped = 0
	for id, a := range f.Attempts {
		p.Attempts[id] = attemptView{a.Held(), a.VMLive(), a.Booked(), a.Terminal(), a.Stage(), a.ReleaseReason,
			events.LabelKey(a.Labels), a.Releases(), a.JobID, f.BoundJob(id), a.LastAt}
	}
	for id, j := range f.Jobs {
		p.Jobs[id] = jobView{j.Status, j.Runner, j.Conclusion, events.LabelKey(j.Labels), j.Minted,
			j.FailedAttempts, j.Unschedulable, j.QueuedAt, j.CompletedAt}
	}
	for name, h := range f.Hosts {
		p.Hosts[name] = hostView{h.Booked, h.LiveVMs, h.AbandonedVMs, h.PhysicalCap, h.Cordoned, h.State,
			h.Boot, h.CordonReason}
	}
	return p
}

func requireSame(t *rapid.T, what string, got, want projection) {
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s folds differently:\n got %+v\nwant %+v", what, got, want)
	}
}

// shuffledWithDuplicates is the history in a random order with random
// redeliveries mixed in.
func shuffledWithDuplicates(t *rapid.T, h []events.Event) []events.Event {
	out := append([]events.Event(nil), h...)
	for n := rapid.IntRange(0, len(h)).Draw(t, "duplicates"); n > 0; n-- {
		out = append(out, h[rapid.IntRange(0, len(h)-1).Draw(t, "duplicate")])
	}
	return rapid.Permutation(out).Draw(t, "order")
}

func TestPropertyValidHistoryKeepsEveryInvariant(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f := events.NewFleet()
		for i, e := range genHistory(t) {
			f.Apply(e)
			if vs := f.Check(); len(vs) != 0 {
				t.Fatalf("after event %d (%s %s): violations %v", i, e.Type(), e.ID, vs)
			}
		}
	})
}

func TestPropertyOrderAndRedeliveryDoNotMatter(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := genHistory(t)
		want := project(given(h...))
		reversed := make([]events.Event, 0, len(h))
		for i := len(h) - 1; i >= 0; i-- {
			reversed = append(reversed, h[i])
		}
		requireSame(t, "the reversed history", project(given(reversed...)), want)
		for i := 0; i < 4; i++ {
			requireSame(t, "a shuffled history with redeliveries", project(given(shuffledWithDuplicates(t, h)...)), want)
		}
	})
}

func TestPropertyApplyingTwiceIsApplyingOnce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := genHistory(t)
		twice := make([]events.Event, 0, 2*len(h))
		for _, e := range h {
			twice = append(twice, e, e)
		}
		requireSame(t, "every event applied twice", project(given(twice...)), project(given(h...)))
	})
}

func TestPropertyCountersEqualRecountInAnyOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f := events.NewFleet()
		for i, e := range shuffledWithDuplicates(t, genHistory(t)) {
			f.Apply(e)
			for _, v := range f.Check() {
				if v.Rule == events.RuleCountersMatched {
					t.Fatalf("after %d events (last %s %s): %v", i+1, e.Type(), e.ID, v)
				}
			}
		}
		if vs := f.Check(); len(vs) != 0 {
			t.Fatalf("after the whole shuffled history: violations %v", vs)
		}
	})
}

// Given any history, applied in order and in any order with redeliveries,
// and read or compacted at any point, the live index (what the deciders
// walk) holds exactly the jobs and attempts a full scan of the fold finds
// open, and QuietDue the quiet attempts a scan finds past its cuts. (A
// shuffled history seldom holds a state only its order makes, such as an
// operator's teardown of a VM whose job still runs, hence both.)
func TestPropertyLiveIndexEqualsAFullScan(t *testing.T) {
	var due [3]int // quiet attempts QuietDue yielded, per deadline, over every history
	rapid.Check(t, func(t *rapid.T) {
		h := genLeakyHistory(t)
		for _, h := range [][]events.Event{h, shuffledWithDuplicates(t, h)} {
			f := events.NewFleet()
			var last time.Time
			for i, e := range h {
				f.Apply(e)
				if e.Time.After(last) {
					last = e.Time
				}
				requireQuietDue(t, f, i+1, &due)
				switch rapid.IntRange(0, 9).Draw(t, "then") {
				case 0:
					requireIndexed(t, f, i+1)
				case 1:
					f.Compact(last, time.Duration(rapid.IntRange(0, 120).Draw(t, "retention s"))*time.Second)
				}
			}
			requireQuietDue(t, f, -1, &due)
			f.Compact(last.Add(time.Hour), time.Minute)
			requireIndexed(t, f, -1)
		}
	})
	t.Logf("quiet attempts due per deadline (job started, teardown, VM stopped): %v", due)
	for k, n := range due {
		if n == 0 {
			t.Fatalf("no history made a quiet attempt due by deadline %d: the histories do not exercise QuietDue (due per deadline %v)", k, due)
		}
	}
}

// requireQuietDue: for cuts drawn over the history's times, QuietDue
// yields, once each, exactly the quiet attempts (live, not unquiet) a
// full scan finds past one of the cuts; due counts them per deadline.
func requireQuietDue(t *rapid.T, f *events.Fleet, after int, due *[3]int) {
	cut := func(name string) time.Time {
		switch s := rapid.IntRange(-1, 900).Draw(t, name); {
		case s < 0:
			return time.Time{} // none of that kind
		case s > 600: // past every history's end (300 steps of 0–2 s)
			return t0.Add(time.Hour)
		default:
			return t0.Add(time.Duration(s) * time.Second)
		}
	}
	cuts := events.QuietCuts{Started: cut("started cut"), Teardown: cut("teardown cut"), Stopped: cut("stopped cut")}
	before := func(at, c time.Time) bool { return !c.IsZero() && !at.After(c) }
	unquiet := map[string]bool{}
	for a := range f.UnquietAttempts() {
		unquiet[a.ID] = true
	}
	want := map[string]int{}
	for a := range f.LiveAttempts() {
		if unquiet[a.ID] {
			continue
		}
		j := f.Jobs[f.BoundJob(a.ID)]
		kinds := [3]bool{
			j != nil && j.Status == events.StatusInProgress && !j.StartedAt.IsZero() && before(j.StartedAt, cuts.Started),
			a.TeardownReq && !a.Stopped && !a.Abandoned && !a.RunsJob() && before(a.TeardownAt, cuts.Teardown),
			a.Held() && a.Stopped && before(a.StoppedAt, cuts.Stopped),
		}
		for k, in := range kinds {
			if in {
				due[k]++
				want[a.ID] = 1
			}
		}
	}
	got := map[string]int{}
	for a := range f.QuietDue(cuts) {
		got[a.ID]++
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("after %d events, cuts %+v: QuietDue yields %v (times each), a full scan finds %v", after, cuts, got, want)
	}
}

func requireIndexed(t *rapid.T, f *events.Fleet, after int) {
	for _, slots := range []bool{false, true} {
		want := f.StatusByScan(slots)
		got := f.StatusCounts()
		if slots {
			got = f.Status()
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("after %d events: the status from the index differs from a full scan's (held slots listed: %v):\nindex %+v\nscan  %+v", after, slots, got, want)
		}
	}
	wantJobs, wantAttempts, wantVMs, wantUnquiet := map[int64]bool{}, map[string]bool{}, map[string]bool{}, map[string]bool{}
	for id, j := range f.Jobs {
		if j.Demand() || (j.Conflict != "" && !j.ConflictRecorded && j.Status == events.StatusInProgress) || (j.AlsoOn != "" && !j.ConflictRecorded) {
			wantJobs[id] = true
		}
	}
	for id, a := range f.Attempts {
		if !a.Terminal() || (a.TeardownReq && !a.Stopped) || (a.RunnerID != 0 && !a.Deregistered && f.BoundJob(id) == 0) {
			wantAttempts[id] = true
		}
		if !a.Terminal() || (a.TeardownReq && !a.Stopped) {
			wantVMs[id] = true
		}
		bound := f.BoundJob(id)
		quiet := a.Held() && !(a.Failed && a.FailedStep == events.StepDrain) && !(a.Warm && !a.Placed) &&
			bound != 0 && f.Jobs[bound] != nil && f.Jobs[bound].Status != events.StatusCompleted && a.BoundJobID != 0
		if wantAttempts[id] && !quiet {
			wantUnquiet[id] = true
		}
	}
	gotUnquiet := map[string]bool{}
	for a := range f.UnquietAttempts() {
		gotUnquiet[a.ID] = true
	}
	if !reflect.DeepEqual(gotUnquiet, wantUnquiet) {
		t.Fatalf("after %d events: the unquiet index holds %v, a full scan finds %v", after, gotUnquiet, wantUnquiet)
	}
	gotVMs := map[string]bool{}
	for a := range f.VMAttempts() {
		gotVMs[a.ID] = true
	}
	if !reflect.DeepEqual(gotVMs, wantVMs) {
		t.Fatalf("after %d events: the VM index holds %v, a full scan finds %v", after, gotVMs, wantVMs)
	}
	requireDemandIndexed(t, f, after)
	gotJobs, gotAttempts := map[int64]bool{}, map[string]bool{}
	for j := range f.OpenJobs() {
		gotJobs[j.ID] = true
	}
	for a := range f.LiveAttempts() {
		gotAttempts[a.ID] = true
	}
	if !reflect.DeepEqual(gotJobs, wantJobs) || !reflect.DeepEqual(gotAttempts, wantAttempts) {
		t.Fatalf("after %d events: index holds jobs %v and attempts %v, a full scan finds %v and %v",
			after, gotJobs, gotAttempts, wantJobs, wantAttempts)
	}
}

// requireDemandIndexed: the pool labels the fold keeps equal a walk over
// the hosts, and the demand index holds, per pool and oldest first, what
// matching every job in demand against them finds.
func requireDemandIndexed(t *rapid.T, f *events.Fleet, after int) {
	if got, want := f.PoolLabels(), f.ScanPoolLabels(); !reflect.DeepEqual(got, want) {
		t.Fatalf("after %d events: the fold keeps pool labels %v, a walk over the hosts finds %v", after, got, want)
	}
	want := map[string][]int64{}
	for _, j := range f.Jobs {
		if !j.Demand() {
			continue
		}
		if pool := events.MatchPool(j.Labels, f.PoolLabels()); pool != "" {
			want[pool] = append(want[pool], j.ID)
		}
	}
	got := map[string][]int64{}
	for pool := range f.PoolLabels() {
		n := 0
		for j := range f.DemandOldest(pool) {
			got[pool] = append(got[pool], j.ID)
			n++
		}
		if n != f.DemandCount(pool) {
			t.Fatalf("after %d events: pool %s: DemandCount %d, DemandOldest yields %d", after, pool, f.DemandCount(pool), n)
		}
	}
	for pool, ids := range want {
		slices.SortFunc(ids, func(a, b int64) int {
			if c := f.Jobs[a].QueuedAt.Compare(f.Jobs[b].QueuedAt); c != 0 {
				return c
			}
			return cmp.Compare(a, b)
		})
		want[pool] = ids
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("after %d events: the demand index holds %v, a full scan finds %v", after, got, want)
	}
	for pool := range f.PoolLabels() {
		wantRoom, gotRoom := map[string]bool{}, map[string]bool{}
		for name, h := range f.Hosts {
			if ps, ok := h.Pools[pool]; ok && h.Accepts() && h.CurveKey != "" && ps.Slots-h.Held[pool] > 0 && h.PhysicalCap-h.Booked > 0 {
				wantRoom[name] = true
			}
		}
		for h := range f.HostsWithRoom(pool) {
			gotRoom[h.Name] = true
		}
		if !reflect.DeepEqual(gotRoom, wantRoom) {
			t.Fatalf("after %d events: pool %s: the host index has room on %v, a full scan on %v", after, pool, gotRoom, wantRoom)
		}
		checkRanking(t, after, f, pool)
	}
	wantConflicts, gotConflicts := map[int64]bool{}, map[int64]bool{}
	for id, j := range f.Jobs {
		if j.ConflictToRecord() {
			wantConflicts[id] = true
		}
	}
	for j := range f.ConflictJobs() {
		gotConflicts[j.ID] = true
	}
	if !reflect.DeepEqual(gotConflicts, wantConflicts) {
		t.Fatalf("after %d events: the conflict index holds %v, a full scan finds %v", after, gotConflicts, wantConflicts)
	}
}

// checkRanking holds the fold's ranking of the hosts with room in pool
// (HostsByRoom, DegradedWithRoom) to a full scan: every host RankForRoom
// says has room, under the rank it says, the degraded ones apart and the
// others best first.
func checkRanking(t *rapid.T, after int, f *events.Fleet, pool string) {
	type ranked struct {
		name string
		rank events.RoomRank
	}
	var want, got []ranked
	wantDegraded, gotDegraded := map[string]bool{}, map[string]bool{}
	for name, h := range f.Hosts {
		switch r, ok := h.RankForRoom(pool); {
		case ok && r.Degraded:
			wantDegraded[name] = true
		case ok:
			want = append(want, ranked{name, r})
		}
	}
	slices.SortFunc(want, func(a, b ranked) int {
		return cmp.Or(-cmp.Compare(a.rank.Free, b.rank.Free), cmp.Compare(a.rank.Streak, b.rank.Streak), cmp.Compare(a.name, b.name))
	})
	for _, e := range f.HostsByRoom(pool) {
		got = append(got, ranked{e.Host.Name, e.Rank})
	}
	for name := range f.DegradedWithRoom(pool) {
		gotDegraded[name] = true
	}
	if !slices.Equal(got, want) {
		t.Fatalf("after %d events: pool %s: the ranking holds %v, a full scan ranks %v", after, pool, got, want)
	}
	if !reflect.DeepEqual(gotDegraded, wantDegraded) {
		t.Fatalf("after %d events: pool %s: degraded with room: the index holds %v, a full scan finds %v", after, pool, gotDegraded, wantDegraded)
	}
}

// Given any run of bookings, releases charged to hosts or not, starts,
// degradations, recoveries and cordons on four hosts, read at any point,
// the ranking a booking walks (HostsByRoom, DegradedWithRoom) is what a
// full scan of the hosts ranks (RankForRoom): no host is left under a
// rank it no longer has.
func TestPropertyHostRankingEqualsAFullScan(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f := events.NewFleet()
		var seq uint64
		apply := func(p events.Payload) {
			seq++
			e := events.New("test", t0.Add(time.Duration(seq)*time.Second), p)
			e.Seq = seq
			f.Apply(e)
		}
		hosts := []string{"h-a", "h-b", "h-c", "h-d"}
		for _, h := range hosts {
			o := events.HostOnline{Host: h, Boot: "b", PhysicalCap: 8, CurveKey: "X" + h, Backend: "exec",
				Pools: map[string]events.PoolSlots{"linux": {Labels: []string{"self-hosted", "linux"}, Slots: rapid.IntRange(1, 4).Draw(t, "slots")}}}
			g := events.GrantClaim(o)
			apply(&o)
			apply(&g)
		}
		var held []events.AttemptRef
		for i := range rapid.IntRange(1, 60).Draw(t, "steps") {
			h := rapid.SampledFrom(hosts).Draw(t, "host")
			at := t0.Add(time.Duration(i+1) * time.Hour)
			switch rapid.IntRange(0, 5).Draw(t, "step") {
			case 0, 1:
				r := events.AttemptRef{Attempt: events.AttemptID(int64(i+1), 1), Pool: "linux", Host: h}
				apply(&events.SlotReserved{Pool: "linux", Host: h, Attempt: r.Attempt, JobID: int64(i + 1), N: 1})
				held = append(held, r)
			case 2:
				if len(held) == 0 {
					continue
				}
				k := rapid.IntRange(0, len(held)-1).Draw(t, "release")
				r := held[k]
				held = append(held[:k], held[k+1:]...)
				reason, culprit := events.ReleaseCompleted, ""
				if rapid.Bool().Draw(t, "failed") {
					reason, culprit = events.ReleaseCreateFailed, events.CulpritHost
				}
				apply(&events.SlotReleased{Pool: "linux", Host: r.Host, Attempt: r.Attempt, Reason: reason, Culprit: culprit})
			case 3:
				if len(held) > 0 {
					apply(&events.AttemptRunnerStarted{AttemptRef: held[len(held)-1], Took: time.Second})
				}
			case 4:
				hc := events.HostChange{Host: h, Reason: "test", At: at}
				if rapid.Bool().Draw(t, "degrade") {
					apply(&events.HostDegraded{HostChange: hc, Culprit: events.CulpritHost, Failures: 3})
				} else {
					apply(&events.HostRecovered{HostChange: hc})
				}
			case 5:
				hc := events.HostChange{Host: h, Reason: "test", At: at}
				if rapid.Bool().Draw(t, "cordon") {
					apply(&events.HostCordoned{HostChange: hc})
				} else {
					apply(&events.HostUncordoned{HostChange: hc})
				}
			}
			if rapid.Bool().Draw(t, "read") {
				checkRanking(t, int(seq), f, "linux")
			}
		}
		checkRanking(t, int(seq), f, "linux")
	})
}
