package events

import (
	"fmt"
	"sort"
)

// Violation is one broken fleet invariant, with the aggregate it concerns.
type Violation struct {
	Rule    string `json:"rule"`
	Subject string `json:"subject"`
	Detail  string `json:"detail"`
}

func (v Violation) String() string { return v.Rule + " " + v.Subject + ": " + v.Detail }

// Invariant names.
const (
	RuleHeldPool        = "held<=capacity(pool)"
	RuleHeldHost        = "held<=slots(host,pool)"
	RulePhysical        = "live_vms<=physical_cap(host)"
	RuleReleasedOnce    = "released_at_most_once"
	RuleHeldHasAttempt  = "held_slot_has_live_attempt"
	RuleCountersMatched = "counters_match_attempts"
)

// Check returns every broken invariant, sorted: held ≤ capacity per pool (the
// slots of every host that advertised it) and per host; live VMs ≤ physical cap per host; each reservation released at
// most once; every held slot belongs to an attempt whose VM is not stopped;
// and the incremental counters equal a recount.
func (f *Fleet) Check() []Violation {
	var out []Violation
	add := func(rule, subject, format string, args ...any) {
		out = append(out, Violation{rule, subject, fmt.Sprintf(format, args...)})
	}
	held := map[string]int{}
	hostHeld := map[[2]string]int{}
	live := map[string]int{}
	for _, a := range f.Attempts {
		if a.Releases() > 1 {
			add(RuleReleasedOnce, a.ID, "released %d times", a.Releases())
		}
		if a.Held() {
			held[a.Pool]++
			hostHeld[[2]string{a.Host, a.Pool}]++
			if a.Stopped {
				add(RuleHeldHasAttempt, a.ID, "slot of pool %s on host %s held by a stopped attempt", a.Pool, a.Host)
			}
		}
		if a.VMLive() {
			live[a.Host]++
		}
	}
	for name, p := range f.Pools {
		if held[name] != p.Held {
			add(RuleCountersMatched, name, "pool held counter %d, recount %d", p.Held, held[name])
		}
		// Against every host's slots, lost ones included: a lost host's
		// running jobs keep their slots until they complete (law 7), and
		// the per-host rule below bounds each host.
		c := 0
		for _, h := range f.Hosts {
			c += h.Pools[name].Slots
		}
		if p.Held > c {
			add(RuleHeldPool, name, "held %d > capacity %d", p.Held, c)
		}
	}
	for name, h := range f.Hosts {
		for pool, n := range h.Held {
			if n != hostHeld[[2]string{name, pool}] {
				add(RuleCountersMatched, name, "host held counter %d for pool %s, recount %d", n, pool, hostHeld[[2]string{name, pool}])
			}
			if slots := h.Pools[pool].Slots; n > slots {
				add(RuleHeldHost, name, "pool %s held %d > slots %d", pool, n, slots)
			}
		}
		if h.LiveVMs != live[name] {
			add(RuleCountersMatched, name, "live VM counter %d, recount %d", h.LiveVMs, live[name])
		}
		if h.PhysicalCap > 0 && h.LiveVMs > h.PhysicalCap {
			add(RulePhysical, name, "live VMs %d > physical cap %d", h.LiveVMs, h.PhysicalCap)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}
