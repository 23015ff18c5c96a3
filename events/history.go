package events

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DefaultSettleAfter is how long Compact keeps the whole record of a job or
// an attempt that is over before it leaves only its id (a tombstone), and
// KeepOver bounds what a busy fleet keeps inside that: of the records that
// are over, only the newest KeepOver jobs and KeepOver attempts stay whole.
// The id stays for the retention.
//
// A record settles only once nothing can act on it (settleJob,
// settleAttempt) and a late fact about it is absorbed (settledFact), so the
// wait guards nothing a decider needs: it keeps recent jobs on the page
// (its recent jobs and queue times are the dispatcher's records). What it
// costs is memory, and collections that mark it: at 300 jobs a second ten
// minutes kept 180,000 records in each decider's fold (6.5 KiB a job
// across the bench's folds). Until 2026-12-07 a record over for less than
// a minute stayed whole too, and the services compacted once a minute, so
// a busy fleet's folds held its last one to two minutes: 18,000 to 36,000
// jobs at 300 a second, 130–150 MiB across the bench's folds, and the
// collector's cost a lifecycle doubled over a run. Now a service compacts
// once a minute, or sooner once its fold has grown by KeepOver records
// (CompactDue), and keeps about KeepOver records over, whatever the rate.
const (
	DefaultSettleAfter = 10 * time.Minute
	KeepOver           = 1000
)

// CompactEvery is how often a service compacts its fold at least, and
// CompactSoonest how soon after the last compaction it may compact again
// when its fold grows fast (CompactDue). A compaction walks every record the
// fold keeps, so it is not made on every round.
const (
	CompactEvery   = time.Minute
	CompactSoonest = 5 * time.Second
)

// CompactDue reports whether a service that last compacted its fold at
// last (zero: never) should compact it at now: CompactEvery after, or from
// CompactSoonest on once the fold holds KeepOver more job and attempt
// records than that compaction left. What is live cannot settle, so a fold
// grown only by live records (10,000 running jobs) compacts once more per
// KeepOver of them, not on every round.
func (f *Fleet) CompactDue(now, last time.Time) bool {
	since := now.Sub(last)
	return since >= CompactEvery || (since >= CompactSoonest && len(f.Jobs)+len(f.Attempts) >= f.history.left+KeepOver)
}

// tomb is what is left of a job or an attempt that is over (issue 19): its
// id, which makes a redelivered webhook or a late fact about it harmless,
// and when it ended (unix seconds), so Compact drops it at the retention.
type tomb[K cmp.Ordered] struct {
	ID K     `json:"id"`
	At int64 `json:"at"`
}

// tombs is a set of tombstones sorted by id: exact (never probabilistic)
// and a few bytes each, where a record is a few hundred.
type tombs[K cmp.Ordered] []tomb[K]

func (t tombs[K]) has(id K) bool {
	_, ok := slices.BinarySearchFunc(t, id, func(e tomb[K], id K) int { return cmp.Compare(e.ID, id) })
	return ok
}

// add merges more tombstones in (their ids are not in t: a record becomes
// a tombstone once, and a tombstone is never made a record again).
func (t *tombs[K]) add(more []tomb[K]) {
	*t = merged(*t, more, func(a, b tomb[K]) int { return cmp.Compare(a.ID, b.ID) })
}

// merged is sorted a (sorted by cmp) and more (in any order) together: a
// Compact sorts only what it adds, and merges in O(len(a)), not O(n log n)
// over everything kept.
func merged[E any](a, more []E, cmp func(E, E) int) []E {
	if len(more) == 0 {
		return a
	}
	slices.SortFunc(more, cmp)
	out := make([]E, 0, len(a)+len(more))
	i, k := 0, 0
	for i < len(a) && k < len(more) {
		if cmp(more[k], a[i]) < 0 {
			out = append(out, more[k])
			k++
		} else {
			out = append(out, a[i])
			i++
		}
	}
	out = append(out, a[i:]...)
	return append(out, more[k:]...)
}

// dropBefore removes the tombstones that ended before cut (unix seconds).
func (t *tombs[K]) dropBefore(cut int64) {
	n := len(*t)
	*t = slices.DeleteFunc(*t, func(e tomb[K]) bool { return e.At < cut })
	if len(*t) < n/2 {
		*t = slices.Clip(*t)
	}
}

// history is what the fold keeps of what is over.
type history struct {
	jobs       hourly[uint64, packed] // jobKey(id)
	placements hourly[uint64, packed] // attempts of AttemptID's form (packAttempt), the number coded apart
	attempts   tombs[string]          // other attempts (warm VMs): few
	deliveries hourly[uuidID, uuids]
	// repos: each owner/repo a job fact of an installation named, with
	// the time of the last (unix seconds): where the dispatcher polls for
	// lost webhooks and sweeps runners, through that installation's
	// client, kept per repository for the retention, not per job.
	repos map[repoKey]int64
	peaks peaks
	// left is how many job and attempt records the last compaction left
	// (CompactDue).
	left int
	// noDeliveries: this fold keeps no delivery ids (DropDeliveryIDs).
	noDeliveries bool
}

// attemptLow is how many low bits of a packed attempt are its number.
const attemptLow = 16

func newHistory() history {
	return history{placements: hourly[uint64, packed]{proto: packed{low: attemptLow}}}
}

// jobKey maps a job id onto uint64 in the same order.
func jobKey(id int64) uint64 { return uint64(id) ^ 1<<63 }

// repoKey is a repository as one installation reaches it.
type repoKey struct{ installation, org, repo string }

// Repos lists every owner/repo a job fact of installation ("": the
// default) named within the retention, unsorted.
func (f *Fleet) Repos(installation string) [][2]string {
	var out [][2]string
	for k := range f.history.repos {
		if k.installation == installation {
			out = append(out, [2]string{k.org, k.repo})
		}
	}
	return out
}

func (f *Fleet) sawRepo(installation, org, repo string, at time.Time) {
	if org == "" || repo == "" {
		return
	}
	if f.history.repos == nil {
		f.history.repos = map[repoKey]int64{}
	}
	k := repoKey{installation, org, repo}
	if s := at.Unix(); s > f.history.repos[k] {
		f.history.repos[k] = s
	}
}

// Settled reports whether job id is over and only its id is left: it
// completed, and every attempt that served it is done.
func (f *Fleet) Settled(id int64) bool { return f.history.jobs.has(jobKey(id)) }

// KnownJob reports whether the fold knows job id: as a record or as a
// tombstone.
func (f *Fleet) KnownJob(id int64) bool { return f.Jobs[id] != nil || f.Settled(id) }

// SettledAttempt reports whether attempt id is over and only its id is left.
func (f *Fleet) SettledAttempt(id string) bool {
	if k, ok := packAttempt(id); ok {
		return f.history.placements.has(k)
	}
	return f.history.attempts.has(id)
}

// packAttempt reads an attempt id of AttemptID's form (berth-<job>-<n>)
// into 8 bytes: the job id above 16 bits of attempt number. Only the exact
// form AttemptID writes, in range, is taken (so it is one-to-one); any
// other id (a warm VM's) stays a string.
func packAttempt(id string) (uint64, bool) {
	rest, ok := strings.CutPrefix(id, "berth-")
	if !ok {
		return 0, false
	}
	i := strings.LastIndexByte(rest, '-')
	if i <= 0 {
		return 0, false
	}
	job, err1 := strconv.ParseInt(rest[:i], 10, 64)
	n, err2 := strconv.ParseUint(rest[i+1:], 10, 16)
	if err1 != nil || err2 != nil || job < 0 || job >= 1<<47 || AttemptID(job, int(n)) != id {
		return 0, false
	}
	return uint64(job)<<attemptLow | n, true
}

// SettledCounts is how many jobs and attempts are kept as tombstones.
func (f *Fleet) SettledCounts() (jobs, attempts int) {
	return f.history.jobs.len(), f.history.placements.len() + len(f.history.attempts)
}

// settleJob reports whether the completed job may leave only its id.
func (f *Fleet) settleJob(j *Job, cut time.Time) bool {
	return j.Status == StatusCompleted && j.CompletedAt.Before(cut) && !j.conflictToRecord()
}

// settleAttempt reports whether the attempt may leave only its id: nothing
// can happen to its slot or its VM any more, and no runner registration of
// it is left to delete (it ran a job, which GitHub removes it after, or it
// was deregistered, or it never had one).
func (f *Fleet) settleAttempt(a *Attempt, cut time.Time) bool {
	return a.Terminal() && !vmPending(a) && a.LastAt.Before(cut) &&
		(a.RunnerID == 0 || a.Deregistered || a.BoundJobID != 0 || f.byRunner[a.ID] != 0 || !f.sawJobs)
}

// settledFact reports whether e is about a job or an attempt that only a
// tombstone is left of: a redelivery, or a late fact about something over,
// which the record it would have touched absorbed too. It still moves a
// pool ledger's sequence (or a later booking there would conflict forever)
// and keeps a job fact's delivery id (what must not be asked again).
func (f *Fleet) settledFact(e Event) bool {
	switch d := e.Data.(type) {
	case *JobQueued, *JobWaiting, *JobInProgress, *JobCompleted:
		f.sawJobs = true
		return false // jobFact keeps the delivery id, then checks
	case *JobConflict:
		f.sawJobs = true
		return f.Settled(d.JobID)
	case *JobUnschedulable:
		f.sawJobs = true
		return f.Settled(d.JobID)
	case *SlotReserved:
		return f.settledLedger(d.Pool, d.Attempt, e.Seq)
	case *SlotReleased:
		return f.settledLedger(d.Pool, d.Attempt, e.Seq)
	case *AttemptClaimed:
		return f.settledLedger(d.Pool, d.Attempt, e.Seq)
	case interface{ attemptRef() AttemptRef }:
		return f.SettledAttempt(d.attemptRef().Attempt)
	}
	return false
}

func (f *Fleet) settledLedger(pool, attempt string, seq uint64) bool {
	if !f.SettledAttempt(attempt) {
		return false
	}
	f.poolSeq(pool, seq)
	return true
}

func (r AttemptRef) attemptRef() AttemptRef { return r }

// uuidID is a GitHub delivery id (X-GitHub-Delivery, a UUID written in
// lower-case hex) in 16 bytes instead of a 36-byte string.
type uuidID [16]byte

// parseUUID reads id when it is a UUID in GitHub's form (8-4-4-4-12
// lower-case hex digits). Only that exact form is taken, so reading is
// one-to-one and a lookup is exact; any other id is kept as a string.
func parseUUID(id string) (u uuidID, ok bool) {
	if len(id) != 36 || id[8] != '-' || id[13] != '-' || id[18] != '-' || id[23] != '-' {
		return u, false
	}
	n := 0
	for i := 0; i < 36; i += 2 {
		if id[i] == '-' {
			i--
			continue
		}
		hi, ok1 := lowerHex(id[i])
		lo, ok2 := lowerHex(id[i+1])
		if !ok1 || !ok2 || n == 16 {
			return u, false
		}
		u[n] = hi<<4 | lo
		n++
	}
	return u, n == 16
}

func lowerHex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// DeliveryStored reports whether a job fact carrying GitHub delivery id
// (X-GitHub-Delivery) is in the fold: what the dispatcher must not ask
// GitHub to redeliver. Ids are kept for DeliveryMemory (GitHub redelivers
// for 3 days) or the retention, whichever is longer. A fold that dropped
// delivery ids (DropDeliveryIDs) holds none.
func (f *Fleet) DeliveryStored(id string) bool {
	if _, ok := f.Deliveries[id]; ok {
		return true
	}
	if u, ok := parseUUID(id); ok {
		return f.history.deliveries.has(u)
	}
	return false
}

// DropDeliveryIDs makes the fold keep no GitHub delivery ids, and forget
// those it has: only the dispatcher asks GitHub to redeliver
// (DeliveryStored), and a job's three webhooks cost 48 bytes for three days
// in every fold that keeps them.
func (f *Fleet) DropDeliveryIDs() {
	f.history.noDeliveries = true
	f.history.deliveries = hourly[uuidID, uuids]{}
	clear(f.Deliveries)
}

// KeepsDeliveryIDs reports whether the fold keeps GitHub delivery ids.
func (f *Fleet) KeepsDeliveryIDs() bool { return !f.history.noDeliveries }

// settleDeliveries moves the delivery ids older than cut that are UUIDs
// out of the map into the packed hours, and drops the hours older than
// dcut.
func (f *Fleet) settleDeliveries(cut time.Time, dcut int64) {
	var more []stamped[uuidID]
	for id, at := range f.Deliveries {
		if !at.Before(cut) {
			continue
		}
		if u, ok := parseUUID(id); ok {
			more = append(more, stamped[uuidID]{u, at.Unix()})
			delete(f.Deliveries, id)
		}
	}
	f.history.deliveries.add(more)
	f.history.deliveries.dropBefore(dcut)
}

// unmarshalDeliveries reads the settled delivery ids of a snapshot that an
// earlier build wrote: 24 bytes each (the id, then the unix seconds,
// big-endian).
func unmarshalDeliveries(b []byte) ([]stamped[uuidID], error) {
	if len(b)%24 != 0 {
		return nil, fmt.Errorf("settled deliveries: %d bytes, not a multiple of 24", len(b))
	}
	out := make([]stamped[uuidID], 0, len(b)/24)
	for i := 0; i < len(b); i += 24 {
		var e stamped[uuidID]
		copy(e.key[:], b[i:i+16])
		e.at = int64(binary.BigEndian.Uint64(b[i+16 : i+24]))
		out = append(out, e)
	}
	return out, nil
}

// peaks are the largest sizes the fold's maps of records reached since
// they were last rebuilt: a Go map keeps its buckets when entries are
// deleted, so after a burst the maps are rebuilt at their new size, or a
// fold that served a million jobs would keep room for a million records.
type peaks struct{ jobs, attempts, byRunner, deliveries int }

// shrunk returns m, or a copy of it at its size once it holds less than a
// quarter of its peak (and the peak was worth it).
func shrunk[K comparable, V any](m map[K]V, peak *int) map[K]V {
	*peak = max(*peak, len(m))
	if *peak < 1024 || len(m) >= *peak/4 {
		return m
	}
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	*peak = len(out)
	return out
}
