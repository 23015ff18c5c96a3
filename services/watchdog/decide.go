// Package watchdog owns the deadlines derived from the log: provisioning and
// teardown deadlines, lost hosts, demand that waits, and slot leaks.
// decide.go is its pure part.
package watchdog

import (
	"fmt"
	"sort"
	"time"

	"github.com/berth-ci/berth/events"
)

// Params are the watchdog's deadlines.
type Params struct {
	ProvisionTimeout   time.Duration
	TeardownTimeout    time.Duration
	HostTTL            time.Duration
	DemandWaitingAfter time.Duration
	DemandWaitingEvery time.Duration
	LeakGrace          time.Duration
}

// Plan is what the watchdog appends. Releases come first: they end demand
// and must not wait on anything (law 2).
type Plan struct {
	Release  []events.SlotReleased
	Teardown []events.AttemptTeardownRequested
	Abandon  []events.AttemptAbandoned
	Lost     []events.HostLost
	Demand   []events.DemandWaiting
	Raise    []events.AlarmRaised
	Clear    []events.AlarmCleared
}

// Decide derives the watchdog's facts from the fold at time now. heartbeats
// maps host → its last heartbeat (hosts missing from it have never beaten).
func Decide(f *events.Fleet, now time.Time, heartbeats map[string]time.Time, p Params) Plan {
	var plan Plan
	hosts := make([]string, 0, len(f.Hosts))
	for name := range f.Hosts {
		hosts = append(hosts, name)
	}
	sort.Strings(hosts)
	lost := map[string]bool{}
	for _, name := range hosts {
		h := f.Hosts[name]
		if h.State == events.HostStateLost {
			lost[name] = true
			continue
		}
		if hb, ok := heartbeats[name]; ok && now.Sub(hb) > p.HostTTL {
			lost[name] = true
			plan.Lost = append(plan.Lost, events.HostLost{HostChange: events.HostChange{Host: name, At: now,
				Reason: fmt.Sprintf("no heartbeat for %s (ttl %s); restart its vmagent or check its network", now.Sub(hb).Round(time.Second), p.HostTTL)}})
		}
	}
	ids := make([]string, 0, len(f.Attempts))
	for id := range f.Attempts {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	active := map[string]bool{}
	for _, id := range ids {
		a := f.Attempts[id]
		ref := events.AttemptRef{Attempt: a.ID, Pool: a.Pool, Host: a.Host}
		bound := f.BoundJob(a.ID)
		switch {
		case a.Held() && lost[a.Host]:
			plan.release(a, events.ReleaseHostLost)
		case a.Held() && bound == 0 && !a.RunnerStarted && !a.Failed && now.Sub(a.ReservedAt) > p.ProvisionTimeout:
			plan.release(a, events.ReleaseProvisionTimeout)
		case a.TeardownReq && !a.Stopped && !a.Abandoned && now.Sub(a.TeardownAt) > p.TeardownTimeout:
			plan.Abandon = append(plan.Abandon, events.AttemptAbandoned{AttemptRef: ref, Step: "stop", After: p.TeardownTimeout})
		}
		if a.Held() && a.Stopped && now.Sub(a.StoppedAt) > p.LeakGrace {
			key := events.AlarmSlotLeak + "/" + a.Pool + "/" + a.ID
			active[key] = true
			if al := f.Alarms[key]; al == nil || !al.Active {
				plan.Raise = append(plan.Raise, events.AlarmRaised{Key: key, Kind: events.AlarmSlotLeak, Pool: a.Pool, At: now,
					Message: fmt.Sprintf("suspected slot leak: attempt %s holds a slot of pool %s on host %s but its VM stopped at %s; run `berth replay --check`, then release it by hand if it persists",
						a.ID, a.Pool, a.Host, a.StoppedAt.Format(time.RFC3339))})
			}
		}
	}
	for key, al := range f.Alarms {
		if al.Active && al.Kind == events.AlarmSlotLeak && !active[key] {
			plan.Clear = append(plan.Clear, events.AlarmCleared{Key: key, Pool: al.Pool, At: now})
		}
	}
	plan.Demand = waiting(f, now, p)
	return plan
}

func (p *Plan) release(a *events.Attempt, reason string) {
	p.Release = append(p.Release, events.SlotReleased{Pool: a.Pool, Host: a.Host, Attempt: a.ID, Reason: reason, JobID: a.JobID})
	if a.Placed && !a.TeardownReq {
		p.Teardown = append(p.Teardown, events.AttemptTeardownRequested{
			AttemptRef: events.AttemptRef{Attempt: a.ID, Pool: a.Pool, Host: a.Host}, Reason: reason})
	}
}

// waiting reports, per pool, queued jobs that have waited for a runner
// longer than DemandWaitingAfter, at most once every DemandWaitingEvery
// (law 6: visible when stuck).
func waiting(f *events.Fleet, now time.Time, p Params) []events.DemandWaiting {
	labels := f.PoolLabels()
	type agg struct {
		n      int
		oldest *events.Job
	}
	per := map[string]*agg{}
	for _, j := range f.Jobs {
		if !j.Demand() || now.Sub(j.QueuedAt) < p.DemandWaitingAfter {
			continue
		}
		pool := events.MatchPool(j.Labels, labels)
		if pool == "" {
			if !events.Serves(j.Labels, []string{"self-hosted"}) {
				continue // a GitHub-hosted job: not ours to serve
			}
			pool = "unmatched"
		}
		g := per[pool]
		if g == nil {
			g = &agg{}
			per[pool] = g
		}
		g.n++
		if g.oldest == nil || j.QueuedAt.Before(g.oldest.QueuedAt) {
			g.oldest = j
		}
	}
	var out []events.DemandWaiting
	for pool, g := range per {
		if last, ok := f.DemandReported[pool]; ok && now.Sub(last) < p.DemandWaitingEvery {
			continue
		}
		reason := "every slot of the pool is held"
		if pool == "unmatched" {
			reason = "no pool's labels include the job's labels; add a pool or fix runs-on"
		} else if f.Capacity(pool) == 0 {
			reason = "no online host offers this pool"
		}
		out = append(out, events.DemandWaiting{Pool: pool, Jobs: g.n, OldestJobID: g.oldest.ID,
			Waited: now.Sub(g.oldest.QueuedAt), Reason: reason, At: now})
	}
	sort.Slice(out, func(i, k int) bool { return out[i].Pool < out[k].Pool })
	return out
}
