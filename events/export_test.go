package events

import "time"

// ScanPoolLabels is PoolLabels from a walk over every host, as it was
// computed before the fold kept it: what the kept labels must equal.
func (f *Fleet) ScanPoolLabels() map[string][]string { l, _ := f.scanPoolLabels(); return l }

// PackedSet packs keys (any order, repeats allowed) in two batches, as two
// Compacts would, with low bits coded apart, and gives its lookup, its size
// and the same set read back from its snapshot form.
func PackedSet(low uint8, first, second []uint64) (has func(uint64) bool, n int, back func(uint64) bool, err error) {
	p := packed{low: low}.with(first).with(second)
	q, err := unmarshalPacked(low, p.marshal())
	return p.has, p.len(), q.has, err
}

// PackedBytes is how many bytes the packed set of keys takes, heads
// included.
func PackedBytes(low uint8, keys []uint64) int {
	p := packed{low: low}.with(keys)
	return len(p.data) + 12*len(p.heads)
}

// StatusByScan is Status as it was derived before the live index kept its
// figures: a walk over every job and attempt the fold keeps. What the
// index gives must equal it.
func (f *Fleet) StatusByScan(slots bool) Status {
	b := newStatusBuilder(f)
	b.slots = slots
	for _, a := range f.Attempts {
		if a.Pool != "" {
			b.addAttempt(a) // every attempt, where the index gives the shown ones
		}
	}
	for _, j := range f.Jobs {
		switch {
		case j.Unschedulable && j.Status < StatusInProgress:
			b.st.Jobs.Unschedulable++
		case j.Status == StatusWaiting:
			b.st.Jobs.Waiting++
		case j.Status == StatusQueued:
			b.st.Jobs.Queued++
			if name := b.match.MatchJob(j); name != "" {
				b.pool(name).PendingDemand++
			} else {
				b.st.Jobs.Unmatched++
			}
		case j.Status == StatusInProgress:
			b.st.Jobs.InProgress++
		case j.Status == StatusCompleted:
			b.st.Jobs.Completed++
		}
	}
	b.addHosts()
	b.addAlarms()
	b.st.Jobs.Completed += f.history.jobs.len()
	return b.finish()
}

// CompactKeeping is CompactAfter with how many records over it keeps
// whole given: all but the newest keep settle at once.
func (f *Fleet) CompactKeeping(now time.Time, settle time.Duration, keep int, retention time.Duration) (jobs, attempts int) {
	return f.compact(now, settling{after: settle, keep: keep}, retention)
}
