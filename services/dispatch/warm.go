package dispatch

import (
	"slices"
	"sort"
	"time"

	"github.com/berth-ci/berth/events"
)

// DefaultMaxIdleAge is how long a warm VM may wait for a job before it is
// recycled (issue 8: a VM left idle for hours drifts from its image's
// freshness and holds capacity for nothing).
const DefaultMaxIdleAge = time.Hour

// WarmPool is one pool's warm target (config dispatcher.warm_pools.<pool>).
type WarmPool struct {
	// MinIdle is how many warm VMs (booting or idle) the pool keeps.
	MinIdle int
	// MaxIdleAge recycles an idle VM older than this; 0 means 1 h.
	MaxIdleAge time.Duration
	// Schedule raises or lowers MinIdle while a window is open; the first
	// open window wins.
	Schedule []WarmWindow
	// Location is the time zone the windows are read in; nil means UTC.
	Location *time.Location
	// Hosts keeps at least this many of the pool's warm VMs on each named
	// host (a macOS host whose 2 guests should not both be booked by
	// neighbours' jobs, say); the pool's target still counts them.
	Hosts map[string]int
}

// WarmWindow is open on Days (none: every day) from From to To, minutes
// after midnight in the pool's time zone; To at or before From spans
// midnight (and the window then belongs to the day it opens).
type WarmWindow struct {
	Days     []time.Weekday
	From, To int
	MinIdle  int
}

// Target is the pool's warm target at now.
func (w WarmPool) Target(now time.Time) int {
	loc := w.Location
	if loc == nil {
		loc = time.UTC
	}
	t := now.In(loc)
	minute := t.Hour()*60 + t.Minute()
	for _, win := range w.Schedule {
		if win.open(t.Weekday(), minute) {
			return win.MinIdle
		}
	}
	return w.MinIdle
}

func (win WarmWindow) open(day time.Weekday, minute int) bool {
	on := func(d time.Weekday) bool { return len(win.Days) == 0 || slices.Contains(win.Days, d) }
	if win.From < win.To {
		return on(day) && minute >= win.From && minute < win.To
	}
	// Spans midnight: open from From today, or until To since yesterday.
	return (on(day) && minute >= win.From) || (on((day+6)%7) && minute < win.To)
}

func (w WarmPool) maxIdleAge() time.Duration {
	if w.MaxIdleAge > 0 {
		return w.MaxIdleAge
	}
	return DefaultMaxIdleAge
}

// warmPlacement asks the host's agent to boot a warm VM: no job, no JIT
// config (nothing is minted for a VM no job has claimed: law 1).
func warmPlacement(a *events.Attempt) events.AttemptPlaced {
	return events.AttemptPlaced{AttemptRef: events.AttemptRef{Attempt: a.ID, Pool: a.Pool, Host: a.Host}, Labels: a.Labels, Warm: true}
}

// claimOrder sorts free warm VMs so a job gets the one that serves it
// soonest: idle ones first (the longest idle first), then booting ones (the
// oldest booking first).
func claimOrder(as []*events.Attempt) {
	sort.SliceStable(as, func(i, k int) bool {
		a, b := as[i], as[k]
		if a.Ready != b.Ready {
			return a.Ready
		}
		if a.Ready && !a.ReadyAt.Equal(b.ReadyAt) {
			return a.ReadyAt.Before(b.ReadyAt)
		}
		if !a.ReservedAt.Equal(b.ReservedAt) {
			return a.ReservedAt.Before(b.ReservedAt)
		}
		return a.ID < b.ID
	})
}

// refill plans a pool's warm VMs after its demand was served: books warm
// VMs up to the target on hosts that can keep them, recycles idle VMs past
// the maximum idle age, and releases idle surplus oldest first. It never
// touches a claimed VM: those serve jobs (scale-down never strands demand).
func (plan *Plan) refill(f *events.Fleet, p Params, pool string, labels []string, free []*events.Attempt,
	booked map[string]int, heldNow map[[2]string]int, candidates func(pool string) roomFor) {
	w := p.Warm[pool]
	target := w.Target(p.Now)
	var keep []*events.Attempt
	for _, a := range free {
		if a.Ready && !p.Now.IsZero() && p.Now.Sub(a.ReadyAt) > w.maxIdleAge() {
			plan.Release = append(plan.Release, release(a, events.ReleaseWarmRecycled))
			continue
		}
		keep = append(keep, a)
	}
	onHost := map[string]int{}
	for _, a := range keep {
		onHost[a.Host]++
	}
	if surplus := len(keep) - target; surplus > 0 {
		sort.SliceStable(keep, func(i, k int) bool {
			if !keep[i].ReservedAt.Equal(keep[k].ReservedAt) {
				return keep[i].ReservedAt.Before(keep[k].ReservedAt)
			}
			return keep[i].ID < keep[k].ID
		})
		for _, a := range keep {
			if surplus == 0 {
				break
			}
			if onHost[a.Host] <= w.Hosts[a.Host] {
				continue // its host's own floor keeps it
			}
			onHost[a.Host]--
			surplus--
			plan.Release = append(plan.Release, release(a, events.ReleaseWarmSurplus))
		}
		return
	}
	n := 0
	if lp := f.Pools[pool]; lp != nil {
		n = lp.WarmMinted
	}
	book := func(host string) {
		booked[host]++
		heldNow[[2]string{host, pool}]++
		onHost[host]++
		n++
		plan.Reserve = append(plan.Reserve, events.SlotReserved{Pool: pool, Host: host, Attempt: events.WarmAttemptID(pool, n),
			N: n, Labels: labels, Warm: true})
	}
	have := len(keep)
	hosts := make([]string, 0, len(w.Hosts))
	for h := range w.Hosts {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, h := range hosts { // each named host's floor first, on that host
		for onHost[h] < w.Hosts[h] && pickHost(candidates(pool), pool, booked, heldNow, true, nil, h) != "" {
			book(h)
			have++
		}
	}
	for ; have < target; have++ {
		host := pickHost(candidates(pool), pool, booked, heldNow, true, nil)
		if host == "" {
			return // no room: the pool refills when capacity comes back
		}
		book(host)
	}
}
