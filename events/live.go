package events

import (
	"iter"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/btree"
)

// live indexes the records a decider may still act on, so that the
// dispatcher's and the watchdog's every round walks the live fleet, not the
// history the fold keeps for the retention (72 h by default: at 2,000 jobs a
// minute that is millions of terminal records). It is built from a full scan
// on first use and kept by Apply and Compact from then on: each marks the
// records it touched, and the next read re-judges just those. A fold no
// decider reads (an agent's, the CLI's) never builds it and pays nothing.
type live struct {
	built         bool
	jobs          map[int64]*Job
	attempts      map[string]*Attempt
	vms           map[string]*Attempt // the attempts whose VM is Berth's to act on (a subset)
	unquiet       map[string]*Attempt // the live attempts less the quiet ones (a subset)
	dirtyJobs     map[int64]struct{}
	dirtyAttempts map[string]struct{}
	demand        demandIndex
	conflicts     map[int64]*Job // open jobs with a conflict to record (a subset of jobs)
	// shapeless: jobs in demand that match no pool and name a machine
	// shape (a berth- label): each is unschedulable unless a pool offers
	// the shape (events.UnknownShape), kept here so a round need not walk
	// the backlog to find them.
	shapeless map[int64]*Job
	// ranked holds, per pool, the hosts a booking there may go to (they
	// offer the pool, accept placements, have a curve key to seal to, a
	// free slot of the pool and physical room) as a booking ranks them
	// (RoomRank), best first; those whose machine or image is degraded
	// are in degraded instead. filed is, per host, the pools it is filed
	// in and the rank it was filed under, to find it again.
	ranked     map[string][]RoomEntry
	degraded   map[string]map[string]*Host
	filed      map[string][]filing
	dirtyHosts map[string]struct{}
	// shown holds the attempts the operator's status counts (shownInStatus:
	// a held slot, or an abandoned VM not seen stopped), and counts the
	// jobs the fold keeps by the status they count under, each job's
	// bucket kept on it (Job.counted) so a change moves it: a status read
	// once a second then walks the live fleet, not the records the fold
	// keeps for the settle window (at 500 jobs/s, 300,000 of them).
	shown  map[string]*Attempt
	counts JobCounts
	due    dueIndex // the quiet attempts by their deadlines' clocks (due.go)
}

// jobBucket is the JobCounts figure a job counts under.
type jobBucket uint8

const (
	notCounted jobBucket = iota
	countedWaiting
	countedQueued
	countedInProgress
	countedCompleted
	countedUnschedulable
)

// bucketOf is the figure the operator's status counts the job under: a
// job given up on before it ran is unschedulable, whatever its status.
func bucketOf(j *Job) jobBucket {
	switch {
	case j.Unschedulable && j.Status < StatusInProgress:
		return countedUnschedulable
	case j.Status == StatusWaiting:
		return countedWaiting
	case j.Status == StatusQueued:
		return countedQueued
	case j.Status == StatusInProgress:
		return countedInProgress
	case j.Status == StatusCompleted:
		return countedCompleted
	}
	return notCounted
}

// bump adds d to the figure b names.
func (c *JobCounts) bump(b jobBucket, d int) {
	switch b {
	case countedWaiting:
		c.Waiting += d
	case countedQueued:
		c.Queued += d
	case countedInProgress:
		c.InProgress += d
	case countedCompleted:
		c.Completed += d
	case countedUnschedulable:
		c.Unschedulable += d
	}
}

// recount moves a job to the figure it counts under now.
func (l *live) recount(j *Job) {
	if b := bucketOf(j); b != j.counted {
		l.counts.bump(j.counted, -1)
		l.counts.bump(b, +1)
		j.counted = b
	}
}

// uncount takes a job the fold drops out of the counts.
func (f *Fleet) uncount(j *Job) {
	if f.live.built {
		f.live.counts.bump(j.counted, -1)
	}
	j.counted = notCounted
}

// shownInStatus: the operator's status counts the attempt in its pool, as
// a held slot or as an abandoned VM not seen stopped.
func shownInStatus(a *Attempt) bool {
	return a.Pool != "" && (a.Held() || (a.Abandoned && !a.Stopped))
}

// filing is where fileHost put a host: a pool and its rank there.
type filing struct {
	pool string
	rank RoomRank
}

// RoomRank is how a booking in a pool ranks a host with room there, as
// far as the fold says: the most free slots of the pool first, then the
// shortest failure streak (HostHealth.Streak), then the name. A round's
// own bookings only lower Free. Degraded: the host or its image for the
// pool is degraded, so it takes a booking only as a probe.
type RoomRank struct {
	Free, Streak int
	Degraded     bool
}

// RoomEntry is a host's place in its pool's ranking (HostsByRoom).
type RoomEntry struct {
	Rank RoomRank
	Host *Host
}

// cmpRoom orders a pool's ranking: best first.
func cmpRoom(a, b RoomEntry) int {
	switch {
	case a.Rank.Free != b.Rank.Free:
		return b.Rank.Free - a.Rank.Free
	case a.Rank.Streak != b.Rank.Streak:
		return a.Rank.Streak - b.Rank.Streak
	}
	return strings.Compare(a.Host.Name, b.Host.Name)
}

// demandIndex keeps the jobs in demand (Job.Demand) per pool their labels
// match, oldest first, so a decision round reads how many wait and takes
// the oldest few without walking the backlog. Matching depends on the
// pools' labels: when a host's announcement changes them (gen), the index
// is matched again from the open jobs.
type demandIndex struct {
	gen    uint64
	byPool map[string]*btree.BTreeG[demandItem]
	of     map[int64]demandItem // job → its entry, to find it again when the job changes
}

// demandItem is a job's place in its pool's queue: the queued time and id
// it was filed under (a job's queued time can move earlier, so the entry
// keeps the key it was inserted with).
type demandItem struct {
	at   time.Time
	id   int64
	pool string
	job  *Job
}

func olderDemand(a, b demandItem) bool {
	if !a.at.Equal(b.at) {
		return a.at.Before(b.at)
	}
	return a.id < b.id
}

// open reports whether a decider may still act on the job: it is demand,
// or GitHub reported it on a runner bound to another job and no fact has
// recorded that yet (BL-17).
func (j *Job) open() bool {
	return j.Demand() || j.conflictToRecord()
}

// conflictToRecord: GitHub reported the job on a runner bound to another
// job, or on a second runner, and no fact has recorded it yet.
func (j *Job) conflictToRecord() bool {
	return !j.ConflictRecorded && ((j.Conflict != "" && j.Status == StatusInProgress) || j.AlsoOn != "")
}

// ConflictToRecord reports whether a JobConflict fact is due for the job.
func (j *Job) ConflictToRecord() bool { return j.conflictToRecord() }

// actionable reports whether a decider may still act on the attempt: it
// holds a slot or a VM; or its teardown was asked for and no stop is
// recorded (an agent answers one for a booking that never got a VM); or it
// is done but its runner registration, never used by a job, is still to
// be deleted.
func (f *Fleet) actionable(a *Attempt) bool {
	return vmPending(a) || (a.RunnerID != 0 && !a.Deregistered && f.byRunner[a.ID] == 0)
}

// quiet reports whether a live attempt needs nothing from the dispatcher
// while it stays as it is: it holds its slot for a job its runner took,
// that job has not completed, and its host is not draining it. Most of a
// busy fleet is quiet (10,000 running jobs made the dispatcher's every
// round walk 10,000 attempts, half the CPU of a probe under that load).
func (f *Fleet) quiet(a *Attempt) bool {
	if !a.Held() || (a.Failed && a.FailedStep == StepDrain) || (a.Warm && !a.Placed) {
		return false
	}
	bound := f.byRunner[a.ID]
	j := f.Jobs[bound]
	// Until the dispatcher has recorded the binding on the attempt's own
	// subject (AttemptBound), it has something to do.
	return bound != 0 && j != nil && j.Status != StatusCompleted && a.BoundJobID != 0
}

// vmPending reports whether something may still happen to the attempt's VM:
// it is not Terminal, or its teardown was asked for and no stop is
// recorded.
func vmPending(a *Attempt) bool { return !a.Terminal() || (a.TeardownReq && !a.Stopped) }

// OpenJobs yields, in no order, every job a decider may act on: demand, or
// a conflict not yet recorded. The jobs must not be modified.
func (f *Fleet) OpenJobs() iter.Seq[*Job] {
	f.settle()
	return maps.Values(f.live.jobs)
}

// LiveAttempts yields, in no order, every attempt a decider may act on:
// not Terminal, or terminal with a registration no job used that is not yet
// deleted. The attempts must not be modified.
func (f *Fleet) LiveAttempts() iter.Seq[*Attempt] {
	f.settle()
	return maps.Values(f.live.attempts)
}

// UnquietAttempts yields, in no order, the live attempts that are not
// quiet: what the dispatcher acts on. A quiet attempt becomes unquiet when
// its own facts, its binding or its job's status change, each of which
// marks it. The attempts must not be modified.
func (f *Fleet) UnquietAttempts() iter.Seq[*Attempt] {
	f.settle()
	return maps.Values(f.live.unquiet)
}

// VMAttempts yields, in no order, the live attempts whose VM something may
// still happen to: what an agent acts on. It leaves out attempts live only
// for a runner registration to delete: an agent's fold never sees the job
// facts that bind runners, so there every attempt that ran a job would
// look like one for the retention. The attempts must not be modified.
func (f *Fleet) VMAttempts() iter.Seq[*Attempt] {
	f.settle()
	return maps.Values(f.live.vms)
}

// LiveCounts is the size of the index, for metrics and benchmarks.
func (f *Fleet) LiveCounts() (jobs, attempts int) {
	f.settle()
	return len(f.live.jobs), len(f.live.attempts)
}

func (f *Fleet) markJob(id int64) {
	if f.live.built {
		f.live.dirtyJobs[id] = struct{}{}
	}
}

func (f *Fleet) markHost(name string) {
	if f.live.built {
		f.live.dirtyHosts[name] = struct{}{}
	}
}

func (f *Fleet) markAttempt(id string) {
	if f.live.built {
		f.live.dirtyAttempts[id] = struct{}{}
	}
}

// settle builds the index, or re-judges the records marked since the last
// read.
func (f *Fleet) settle() {
	l := &f.live
	if !l.built {
		f.buildLive()
		return
	}
	for name := range l.dirtyHosts {
		if h := f.Hosts[name]; h != nil {
			f.fileHost(h)
		}
	}
	l.dirtyHosts = emptied(l.dirtyHosts)
	f.rejudgeJobs()
	f.rejudgeAttempts()
}

// buildLive builds the index from a full scan of the fold.
func (f *Fleet) buildLive() {
	l := &f.live
	*l = live{built: true, jobs: map[int64]*Job{}, attempts: map[string]*Attempt{}, vms: map[string]*Attempt{}, unquiet: map[string]*Attempt{},
		dirtyJobs: map[int64]struct{}{}, dirtyAttempts: map[string]struct{}{}, conflicts: map[int64]*Job{}, shapeless: map[int64]*Job{},
		ranked: map[string][]RoomEntry{}, degraded: map[string]map[string]*Host{}, filed: map[string][]filing{},
		dirtyHosts: map[string]struct{}{}, shown: map[string]*Attempt{}}
	for _, h := range f.Hosts {
		f.fileHost(h)
	}
	for id, j := range f.Jobs {
		j.counted = notCounted
		l.recount(j)
		if j.open() {
			l.jobs[id] = j
		}
		if j.conflictToRecord() {
			l.conflicts[id] = j
		}
	}
	f.rematchDemand()
	for id, a := range f.Attempts {
		if f.actionable(a) {
			l.attempts[id] = a
			if !f.quiet(a) {
				l.unquiet[id] = a
			}
		}
		if vmPending(a) {
			l.vms[id] = a
		}
		if shownInStatus(a) {
			l.shown[id] = a
		}
	}
}

// rejudgeJobs moves each job marked since the last read into or out of
// the index's sets, its status count and its pool's demand.
func (f *Fleet) rejudgeJobs() {
	l := &f.live
	rematch := l.demand.gen != f.labels.gen
	for id := range l.dirtyJobs {
		j := f.Jobs[id]
		if j != nil {
			l.recount(j)
		}
		if j != nil && j.open() {
			l.jobs[id] = j
		} else {
			delete(l.jobs, id)
		}
		if j != nil && j.conflictToRecord() {
			l.conflicts[id] = j
		} else {
			delete(l.conflicts, id)
		}
		if !rematch {
			f.fileDemand(id, j)
		}
	}
	l.dirtyJobs = emptied(l.dirtyJobs)
	if rematch {
		f.rematchDemand()
	}
}

// rejudgeAttempts moves each attempt marked since the last read into or
// out of the index's sets.
func (f *Fleet) rejudgeAttempts() {
	l := &f.live
	for id := range l.dirtyAttempts {
		a := f.Attempts[id]
		keep := func(set map[string]*Attempt, in bool) {
			if in {
				set[id] = a
			} else {
				delete(set, id)
			}
		}
		actionable := a != nil && f.actionable(a)
		quiet := actionable && f.quiet(a)
		keep(l.attempts, actionable)
		keep(l.unquiet, actionable && !quiet)
		keep(l.vms, a != nil && vmPending(a))
		keep(l.shown, a != nil && shownInStatus(a))
		if l.due.built {
			var filed *Attempt // not quiet: filed nowhere
			if quiet {
				filed = a
			}
			f.fileDue(id, filed)
		}
	}
	l.dirtyAttempts = emptied(l.dirtyAttempts)
}

// rematchDemand files every open job in demand under the pool it matches
// now (the index's first build, or the pools' labels changed).
func (f *Fleet) rematchDemand() {
	d := &f.live.demand
	*d = demandIndex{gen: f.labels.gen, byPool: map[string]*btree.BTreeG[demandItem]{}, of: map[int64]demandItem{}}
	for id, j := range f.live.jobs {
		f.fileDemand(id, j)
	}
}

// fileDemand moves job id's entry in the demand index to where the job
// (nil: gone from the fold) now belongs, if anywhere.
func (f *Fleet) fileDemand(id int64, j *Job) {
	d := &f.live.demand
	old, had := d.of[id]
	var now demandItem
	want := j != nil && j.Demand()
	if want {
		now = demandItem{at: j.QueuedAt, id: id, pool: f.matcher().MatchJob(j), job: j}
		want = now.pool != ""
		if !want && namesShape(j.Labels) {
			f.live.shapeless[id] = j
		} else {
			delete(f.live.shapeless, id)
		}
	} else {
		delete(f.live.shapeless, id)
	}
	if had && want && old.pool == now.pool && old.at.Equal(now.at) {
		return
	}
	if had {
		d.byPool[old.pool].Delete(old)
		delete(d.of, id)
	}
	if want {
		t := d.byPool[now.pool]
		if t == nil {
			t = btree.NewG(16, olderDemand)
			d.byPool[now.pool] = t
		}
		t.ReplaceOrInsert(now)
		d.of[id] = now
	}
}

// DemandCount is how many jobs wait for a runner in pool: queued (or in
// progress on a runner bound to another job), not given up on, and
// matched to the pool by their labels (MatchPool against PoolLabels).
func (f *Fleet) DemandCount(pool string) int {
	f.settle()
	if t := f.live.demand.byPool[pool]; t != nil {
		return t.Len()
	}
	return 0
}

// DemandOldest yields the jobs DemandCount counts, oldest first (queued
// time, then id); it costs O(log n) plus the jobs taken. The jobs must not
// be modified, and the fold must not change while it runs.
func (f *Fleet) DemandOldest(pool string) iter.Seq[*Job] {
	f.settle()
	t := f.live.demand.byPool[pool]
	return func(yield func(*Job) bool) {
		if t == nil {
			return
		}
		t.Ascend(func(it demandItem) bool { return yield(it.job) })
	}
}

// ShapelessJobs yields, in no order, the jobs in demand that match no pool
// and name a machine shape (a berth- label): the candidates for "unknown
// shape" (UnknownShape). The jobs must not be modified.
func (f *Fleet) ShapelessJobs() iter.Seq[*Job] {
	f.settle()
	return maps.Values(f.live.shapeless)
}

// namesShape reports whether labels hold a machine-shape label.
func namesShape(labels []string) bool {
	for _, l := range labels {
		if IsShapeLabel(l) {
			return true
		}
	}
	return false
}

// ConflictJobs yields, in no order, the jobs a JobConflict fact is due for
// (Job.ConflictToRecord). The jobs must not be modified.
func (f *Fleet) ConflictJobs() iter.Seq[*Job] {
	f.settle()
	return maps.Values(f.live.conflicts)
}

// hasRoom reports whether a booking in pool may go to h, as far as the
// fold says (a round's own bookings can only take room away).
func (h *Host) hasRoom(pool string) bool {
	ps, ok := h.Pools[pool]
	return ok && h.Accepts() && h.CurveKey != "" && ps.Slots-h.Held[pool] > 0 && h.PhysicalCap-h.Booked > 0
}

// RankForRoom is how a booking in pool ranks h (RoomRank), and whether h
// has room there at all (HostsWithRoom).
func (h *Host) RankForRoom(pool string) (RoomRank, bool) {
	if !h.hasRoom(pool) {
		return RoomRank{}, false
	}
	streak, _, _ := h.Health.Streak(time.Time{})
	return RoomRank{Free: h.Pools[pool].Slots - h.Held[pool], Streak: streak,
		Degraded: h.Health.Degraded || h.ImageDegraded(pool) != nil}, true
}

// fileHost moves h to the pools it has room in now, under its rank.
func (f *Fleet) fileHost(h *Host) {
	l := &f.live
	for _, fl := range l.filed[h.Name] {
		if fl.rank.Degraded {
			delete(l.degraded[fl.pool], h.Name)
		} else if i, found := slices.BinarySearchFunc(l.ranked[fl.pool], RoomEntry{fl.rank, h}, cmpRoom); found {
			l.ranked[fl.pool] = slices.Delete(l.ranked[fl.pool], i, i+1)
		}
	}
	filed := l.filed[h.Name][:0]
	for pool := range h.Pools {
		r, ok := h.RankForRoom(pool)
		if !ok {
			continue
		}
		switch {
		case r.Degraded && l.degraded[pool] == nil:
			l.degraded[pool] = map[string]*Host{h.Name: h}
		case r.Degraded:
			l.degraded[pool][h.Name] = h
		default:
			// A sorted slice, not a tree: a booking reads it with no
			// allocation and stops early; moving a host shifts at most
			// a few thousand words.
			e := RoomEntry{r, h}
			i, _ := slices.BinarySearchFunc(l.ranked[pool], e, cmpRoom)
			l.ranked[pool] = slices.Insert(l.ranked[pool], i, e)
		}
		filed = append(filed, filing{pool, r})
	}
	l.filed[h.Name] = filed
}

// HostsWithRoom yields, in no order, the hosts a booking in pool may go
// to as far as the fold says: they offer the pool, accept placements
// (online, not cordoned), have a curve key, a free slot of the pool and
// physical room (HostsByRoom and DegradedWithRoom together). A full fleet
// yields nothing at no cost. The hosts must not be modified.
func (f *Fleet) HostsWithRoom(pool string) iter.Seq[*Host] {
	f.settle()
	ranked, degraded := f.live.ranked[pool], f.live.degraded[pool]
	return func(yield func(*Host) bool) {
		for _, e := range ranked {
			if !yield(e.Host) {
				return
			}
		}
		for _, h := range degraded {
			if !yield(h) {
				return
			}
		}
	}
}

// HostsByRoom is the hosts with room in pool that are not degraded, best
// first by RoomRank, each with its rank: a booking stops at the first
// whose rank cannot beat what it found. The slice and its hosts must not
// be modified, and hold only until the next Apply.
func (f *Fleet) HostsByRoom(pool string) []RoomEntry {
	f.settle()
	return f.live.ranked[pool]
}

// DegradedWithRoom is the hosts with room in pool whose machine or image
// for pool is degraded (RoomRank.Degraded), by name: few, and each takes a
// booking only as a probe. The map and its hosts must not be modified,
// and hold only until the next Apply.
func (f *Fleet) DegradedWithRoom(pool string) map[string]*Host {
	f.settle()
	return f.live.degraded[pool]
}

// emptied empties a set of marks: in place, or, once it held more than a
// few thousand (a Compact marks every record it settles), as a new map, so
// it does not keep the buckets of that peak.
func emptied[K comparable](m map[K]struct{}) map[K]struct{} {
	if len(m) > 4096 {
		return map[K]struct{}{}
	}
	clear(m)
	return m
}
