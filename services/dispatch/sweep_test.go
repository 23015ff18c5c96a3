package dispatch_test

import (
	"slices"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/dispatch"
	"github.com/berth-ci/berth/services/testkit"
)

var sweepT0 = time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)

// sweepFleet is a fold with one runner of each kind the sweep must tell
// apart.
func sweepFleet() *events.Fleet {
	h := testkit.History().HostOnline("h", 8, 8)
	h.Queued(1).Reserved(1, 1, "h")                                                     // booked, its mint on the way: live
	h.Running(2, "h")                                                                   // running its job: live
	h.Done(3, "h", "success")                                                           // over: stranded if GitHub still lists it
	h.Queued(4).Reserved(4, 1, "h").Released(4, 1, "h", events.ReleaseProvisionTimeout) // never placed: a lost mint answer
	h.Queued(7).Booted(7, 1, "h").Released(7, 1, "h", events.ReleaseCompleted)          // released, its VM still up: live
	h.Queued(8).InProgress(8, events.AttemptID(8, 1))                                   // a job in progress is bound to it: live
	return h.Fleet()
}

func listed(names ...string) []dispatch.GitHubRunner {
	var out []dispatch.GitHubRunner
	for i, n := range names {
		out = append(out, dispatch.GitHubRunner{ID: int64(100 + i), Name: n, Status: "offline", Org: "acme"})
	}
	return out
}

func names(rs []dispatch.GitHubRunner) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Name)
	}
	slices.Sort(out)
	return out
}

// Issue 17 (class 5), the sweep's pick: given GitHub's list of runners and
// the fold, when passes run over time, then only Berth-named runners no live
// attempt accounts for are picked, and only once every pass for the grace
// saw them so; a held, running, still-booted, job-bound, busy or foreign
// runner is never picked.
func TestTheSweepPicksOnlyStrandedBerthRunnersAfterTheGrace(t *testing.T) {
	f := sweepFleet()
	s := dispatch.Sweep{Every: time.Minute, Grace: 10 * time.Minute, Limit: 20}
	list := listed(events.AttemptID(1, 1), events.AttemptID(2, 1), events.AttemptID(3, 1), events.AttemptID(4, 1),
		events.AttemptID(5, 1), events.AttemptID(7, 1), events.AttemptID(8, 1), "my-own-runner", events.AttemptID(6, 1))
	list[len(list)-1].Busy = true // berth-6-1: unknown to the fold, but GitHub says it runs a job

	picks, seen := dispatch.SweepPick(f, list, true, nil, sweepT0, s)
	if len(picks) != 0 {
		t.Fatalf("first pass picked %v; nothing is picked before the grace", names(picks))
	}
	picks, seen = dispatch.SweepPick(f, list, true, seen, sweepT0.Add(s.Grace-time.Second), s)
	if len(picks) != 0 {
		t.Fatalf("picked %v a second before the grace", names(picks))
	}
	picks, _ = dispatch.SweepPick(f, list, true, seen, sweepT0.Add(s.Grace), s)
	want := []string{events.AttemptID(3, 1), events.AttemptID(4, 1), events.AttemptID(5, 1)}
	if got := names(picks); !slices.Equal(got, want) {
		t.Fatalf("picked %v, want the stranded %v", got, want)
	}
}

// Given stranded runners seen for the grace, when a pass's list failed or
// came back empty, then nothing is picked and what was seen is kept (law 7:
// a negative read is not a fact).
func TestTheSweepDeletesNothingOnAFailedOrEmptyList(t *testing.T) {
	f := sweepFleet()
	s := dispatch.Sweep{Grace: time.Minute, Limit: 20}
	list := listed(events.AttemptID(5, 1))
	_, seen := dispatch.SweepPick(f, list, true, nil, sweepT0, s)
	later := sweepT0.Add(time.Hour)
	for _, c := range []struct {
		name   string
		list   []dispatch.GitHubRunner
		listed bool
	}{{"failed", nil, false}, {"failed after a page", list, false}, {"empty", nil, true}} {
		picks, kept := dispatch.SweepPick(f, c.list, c.listed, seen, later, s)
		if len(picks) != 0 || len(kept) != 1 {
			t.Fatalf("%s list: picked %v, kept %v; want nothing picked, the stranded runner remembered", c.name, names(picks), kept)
		}
	}
	if picks, _ := dispatch.SweepPick(f, list, true, seen, later, s); len(picks) != 1 {
		t.Fatalf("the next good list picked %v, want the stranded runner", names(picks))
	}
}

// Given more stranded runners than the cap, when a pass picks, then at most
// Limit are picked, the longest stranded first; the rest wait for the next
// pass. A runner that is accounted for again (it took a job) is forgotten,
// so its grace starts over.
func TestTheSweepCapsDeletionsPerPassOldestFirst(t *testing.T) {
	f := sweepFleet()
	s := dispatch.Sweep{Grace: time.Minute, Limit: 20}
	var early, late []string
	for i := range 15 {
		early = append(early, events.AttemptID(int64(1000+i), 1))
		late = append(late, events.AttemptID(int64(2000+i), 1))
	}
	_, seen := dispatch.SweepPick(f, listed(early...), true, nil, sweepT0, s)
	all := listed(append(early, late...)...)
	_, seen = dispatch.SweepPick(f, all, true, seen, sweepT0.Add(time.Minute), s)
	picks, seen := dispatch.SweepPick(f, all, true, seen, sweepT0.Add(2*time.Minute), s)
	if len(picks) != 20 {
		t.Fatalf("picked %d, want the cap of 20", len(picks))
	}
	for _, n := range early {
		if !slices.Contains(names(picks), n) {
			t.Fatalf("%s, stranded longest, was not picked: %v", n, names(picks))
		}
	}
	all[0].Busy = true
	if _, next := dispatch.SweepPick(f, all, true, seen, sweepT0.Add(3*time.Minute), s); next[all[0].ID] != (time.Time{}) {
		t.Fatalf("a busy runner is still remembered as stranded since %v", next[all[0].ID])
	}
}
