package dispatch

import (
	"container/heap"
	"iter"
	"math"

	"github.com/berth-ci/berth/events"
)

// DecideByScan is Decide reading demand the way it did before the fold kept
// indexes (issue 19): every open job walked and matched to its pool, each
// pool's queue ordered by a heap over all of it, and every host judged for
// each booking, on every round. The
// indexed Decide must plan exactly what it plans.
func DecideByScan(f *events.Fleet, p Params) Plan {
	s := scanDemand{f: f, byPool: map[string][]*events.Job{}}
	match := events.NewMatcher(f.PoolLabels())
	for j := range f.OpenJobs() {
		if j.ConflictToRecord() {
			s.conflicting = append(s.conflicting, j)
		}
		if !j.Demand() {
			continue
		}
		if pool := match.MatchJob(j); pool != "" {
			s.byPool[pool] = append(s.byPool[pool], j)
		} else {
			s.unmatched = append(s.unmatched, j)
		}
	}
	return decide(f, p, s)
}

type scanDemand struct {
	f           *events.Fleet
	byPool      map[string][]*events.Job
	conflicting []*events.Job
	unmatched   []*events.Job // in demand, matching no pool
}

func (s scanDemand) shapeless() iter.Seq[*events.Job] {
	return func(yield func(*events.Job) bool) {
		for _, j := range s.unmatched {
			if !yield(j) {
				return
			}
		}
	}
}

func (s scanDemand) count(pool string) int { return len(s.byPool[pool]) }

func (s scanDemand) oldest(pool string) iter.Seq[*events.Job] {
	return func(yield func(*events.Job) bool) {
		h := jobHeap(append([]*events.Job(nil), s.byPool[pool]...))
		heap.Init(&h)
		for h.Len() > 0 {
			if !yield(heap.Pop(&h).(*events.Job)) {
				return
			}
		}
	}
}

func (s scanDemand) conflicts() iter.Seq[*events.Job] {
	return func(yield func(*events.Job) bool) {
		for _, j := range s.conflicting {
			if !yield(j) {
				return
			}
		}
	}
}

type jobHeap []*events.Job

func (h jobHeap) Len() int { return len(h) }
func (h jobHeap) Less(i, k int) bool {
	if !h[i].QueuedAt.Equal(h[k].QueuedAt) {
		return h[i].QueuedAt.Before(h[k].QueuedAt)
	}
	return h[i].ID < h[k].ID
}
func (h jobHeap) Swap(i, k int) { h[i], h[k] = h[k], h[i] }
func (h *jobHeap) Push(x any)   { *h = append(*h, x.(*events.Job)) }
func (h *jobHeap) Pop() any {
	old := *h
	j := old[len(old)-1]
	*h = old[:len(old)-1]
	return j
}

// hosts has pickHost walk every host, as it did before the fold kept the
// hosts with room in rank order: each under a rank no host beats, so the
// walk never stops early, and none apart as degraded.
func (s scanDemand) hosts(string) roomFor {
	var all []events.RoomEntry
	for _, h := range s.f.Hosts {
		all = append(all, events.RoomEntry{Rank: events.RoomRank{Free: math.MaxInt}, Host: h})
	}
	return roomFor{ranked: all}
}

// JobFactOf is the fact the intake stores for a workflow_job payload, by
// its own decoding.
func JobFactOf(delivery string, payload []byte, installation string) (events.Payload, error) {
	e, err := decodeWorkflowJob(payload)
	if err != nil || e.WorkflowJob == nil {
		return nil, err
	}
	return jobFact(delivery, e, installation), nil
}

// MintedCount is how many minted placements the dispatcher keeps in
// memory (each with its sealed JIT config) until its fold shows them.
func (d *Dispatcher) MintedCount() (n int) {
	d.minted.Range(func(_, _ any) bool { n++; return true })
	return n
}
