package events

import (
	"iter"
	"strings"
	"time"

	"github.com/google/btree"
)

// dueIndex files the quiet attempts (live, but not among UnquietAttempts)
// under the times the watchdog's deadlines count from. A quiet attempt
// holds its slot for a job its runner took: no fact it waits for can come
// late, so only the clock can make one overdue, and only by one of these
// three deadlines. The watchdog's round then looks at the quiet attempts
// whose deadline may have passed, not at every running job: 10,000 of
// them made each round walk 10,000 attempts (0.8 ms a round alone,
// BenchmarkDecide/running; 0.95 s of the scale bench's 8 s probe window
// on 2 cores). It is built on the first
// QuietDue and kept by the index's re-judging from then on, so a fold no
// watchdog reads pays nothing.
type dueIndex struct {
	built bool
	trees [dueKinds]*btree.BTreeG[dueItem]
	of    map[string]dueKeys // attempt → the times it is filed under
}

// dueKind is a deadline a quiet attempt can overrun.
type dueKind int

const (
	dueStarted  dueKind = iota // its job's start: the longest a job may run (MaxJobDuration)
	dueTeardown                // its teardown's request, once it runs no job: the stop's deadline
	dueStopped                 // its VM's stop while its slot is still held: a suspected leak
	dueKinds
)

// dueKeys is where an attempt is filed: per kind, whether and under what
// time, and the record filed (a record compacted away and made again
// between two reads is another record under the same keys).
type dueKeys struct {
	at [dueKinds]time.Time
	in [dueKinds]bool
	a  *Attempt
}

type dueItem struct {
	at time.Time
	id string
	a  *Attempt
}

func earlierDue(x, y dueItem) bool {
	if !x.at.Equal(y.at) {
		return x.at.Before(y.at)
	}
	return strings.Compare(x.id, y.id) < 0
}

// QuietCuts are, per deadline, the time before which a quiet attempt's
// clock must have started for the deadline to have passed (now less the
// deadline). A zero field asks for none of that kind (a deadline that is
// off).
type QuietCuts struct {
	// Started: its bound job started running (Job.StartedAt) before this.
	Started time.Time
	// Teardown: its teardown was asked for (Attempt.TeardownAt) before
	// this, its VM is not stopped nor abandoned, and it runs no job.
	Teardown time.Time
	// Stopped: its VM stopped (Attempt.StoppedAt) before this while its
	// slot is held.
	Stopped time.Time
}

// QuietDue yields each quiet attempt (live, not among UnquietAttempts)
// whose clock for one of the deadlines of cuts started at or before its
// cut, once, in no order; a quiet attempt it does not yield has overrun
// none of them. It costs O(log n) plus what it yields. The attempts must
// not be modified, and the fold must not change while it runs.
func (f *Fleet) QuietDue(cuts QuietCuts) iter.Seq[*Attempt] {
	f.settle()
	d := &f.live.due
	if !d.built {
		f.buildDue()
	}
	all := [dueKinds]time.Time{cuts.Started, cuts.Teardown, cuts.Stopped}
	kinds := 0
	for _, cut := range all {
		if !cut.IsZero() {
			kinds++
		}
	}
	return func(yield func(*Attempt) bool) {
		// An attempt filed under two kinds is yielded once; the set is
		// made at the first yield, so a round with nothing due allocates
		// nothing.
		var seen map[string]bool
		for k, cut := range all {
			if cut.IsZero() {
				continue
			}
			more := true
			d.trees[k].Ascend(func(it dueItem) bool {
				if it.at.After(cut) {
					return false
				}
				if kinds > 1 {
					if seen[it.id] {
						return true
					}
					if seen == nil {
						seen = map[string]bool{}
					}
					seen[it.id] = true
				}
				more = yield(it.a)
				return more
			})
			if !more {
				return
			}
		}
	}
}

// buildDue files every quiet attempt.
func (f *Fleet) buildDue() {
	d := &f.live.due
	*d = dueIndex{built: true, of: map[string]dueKeys{}}
	for k := range d.trees {
		d.trees[k] = btree.NewG(16, earlierDue)
	}
	for id, a := range f.live.attempts {
		if _, unquiet := f.live.unquiet[id]; !unquiet {
			f.fileDue(id, a)
		}
	}
}

// dueKeysOf is where a quiet attempt belongs; nil a means it is not quiet
// (or gone) and belongs nowhere.
func (f *Fleet) dueKeysOf(a *Attempt) (k dueKeys) {
	if a == nil {
		return k
	}
	if j := f.Jobs[f.byRunner[a.ID]]; j != nil && j.Status == StatusInProgress && !j.StartedAt.IsZero() {
		k.at[dueStarted], k.in[dueStarted] = j.StartedAt, true
	}
	if a.TeardownReq && !a.Stopped && !a.Abandoned && !a.RunsJob() {
		k.at[dueTeardown], k.in[dueTeardown] = a.TeardownAt, true
	}
	if a.Held() && a.Stopped {
		k.at[dueStopped], k.in[dueStopped] = a.StoppedAt, true
	}
	if k.in != [dueKinds]bool{} {
		k.a = a
	}
	return k
}

// fileDue moves attempt id to where it belongs now: a nil a (not quiet,
// or gone) is taken out.
func (f *Fleet) fileDue(id string, a *Attempt) {
	d := &f.live.due
	old, want := d.of[id], f.dueKeysOf(a)
	if old == want {
		return
	}
	for k := range dueKinds {
		if old.in[k] {
			d.trees[k].Delete(dueItem{at: old.at[k], id: id})
		}
		if want.in[k] {
			d.trees[k].ReplaceOrInsert(dueItem{at: want.at[k], id: id, a: a})
		}
	}
	if want.a == nil {
		delete(d.of, id)
	} else {
		d.of[id] = want
	}
}
