package page

import (
	"time"

	"github.com/berth-ci/berth/events"
)

// Sample is one pool's held slots and demand (jobs queued for it) at At.
type Sample struct {
	At     time.Time
	Held   int
	Demand int
}

// Window is how far back the pictures of held slots and demand reach.
const Window = time.Hour

// history keeps, per pool, the samples of the last Window: a sample per
// round of the page's loop at most every `every`, so its size is bounded
// by Window/every per pool whatever the fleet serves (law 5). It starts
// empty when the dispatcher starts: the pictures show what this process
// has seen.
type history struct {
	every time.Duration
	pools map[string][]Sample
}

func newHistory(every time.Duration) *history {
	return &history{every: every, pools: map[string][]Sample{}}
}

// add records st's pools at now, unless the last sample is younger than
// h.every and equal; drops what is older than Window and pools no longer
// in the status.
func (h *history) add(st events.Status, now time.Time) {
	seen := map[string]bool{}
	for _, p := range st.Pools {
		seen[p.Name] = true
		s := Sample{At: now, Held: p.Held, Demand: p.PendingDemand}
		ss := h.pools[p.Name]
		if n := len(ss); n > 0 && now.Sub(ss[n-1].At) < h.every {
			if ss[n-1].Held == s.Held && ss[n-1].Demand == s.Demand {
				continue
			}
			if n > 1 && now.Sub(ss[n-2].At) < h.every {
				ss[n-1] = s // a burst of changes keeps one sample per period
				continue
			}
		}
		ss = append(ss, s)
		cut := 0
		for cut < len(ss) && now.Sub(ss[cut].At) > Window {
			cut++
		}
		h.pools[p.Name] = append(ss[:0], ss[cut:]...)
	}
	for name := range h.pools {
		if !seen[name] {
			delete(h.pools, name)
		}
	}
}

// of is a copy of pool's samples.
func (h *history) of(pool string) []Sample {
	return append([]Sample(nil), h.pools[pool]...)
}
