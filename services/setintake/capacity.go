package setintake

import "github.com/berth-ci/berth/events"

// Capacity is the X-ScaleSetMaxCapacity a pool's scale set polls with: how
// many of its jobs GitHub may have assigned and unfinished at once. It is
// the pool's free slots on hosts that take placements (online, uncordoned,
// not degraded, with a sealing key), plus the pool's idle warm VMs, less the pool's jobs still waiting for a
// slot (they will take those places), plus the pool's jobs the fold holds
// open (queued or in progress). The last term is there because GitHub counts
// the jobs it already assigned against the capacity while their slots are
// no longer free: without it a full fleet would advertise 0 and GitHub
// would still hold the running jobs, but a fleet one slot short would
// refuse the job that slot was for. A host's physical room, which its
// pools share, does not bound it: a webhook pool with a backlog takes that
// room the moment it frees, so a set bounded by it would be assigned
// nothing while the other pool waits; counted by its own slots, its jobs
// become demand and Decide shares the room between the pools as it does
// for webhook pools. It is pure.
func Capacity(f *events.Fleet, pool string) int {
	n := 0
	for _, h := range f.Hosts {
		ps, ok := h.Pools[pool]
		if !ok || !h.Accepts() || h.Health.Degraded || h.CurveKey == "" {
			continue
		}
		n += max(0, ps.Slots-h.Held[pool])
	}
	for a := range f.LiveAttempts() {
		if a.Pool == pool && a.Idle() {
			n++
		}
	}
	// A job waiting for a slot will take one of those free places: count
	// it once, as open, not again as room.
	return OpenJobs(f, pool) + max(0, n-f.DemandCount(pool))
}

// OpenJobs counts the pool's jobs the fold holds queued or in progress:
// what the statistics' TotalAssignedJobs is compared with. Fleet.OpenJobs
// yields demand (queued jobs) only, so the jobs in progress are counted
// from the live attempts bound to them (their runners are ours), each job
// once. It reads the live indexes, never the history.
func OpenJobs(f *events.Fleet, pool string) int {
	m := f.NewMatcher()
	n := 0
	for j := range f.OpenJobs() {
		if j.Status == events.StatusQueued && m.MatchJob(j) == pool {
			n++
		}
	}
	running := map[int64]bool{}
	for a := range f.LiveAttempts() {
		if j := f.Jobs[f.BoundJob(a.ID)]; a.Pool == pool && j != nil && j.Status == events.StatusInProgress {
			running[j.ID] = true
		}
	}
	return n + len(running)
}
