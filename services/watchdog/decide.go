// Package watchdog owns the deadlines derived from the log: provisioning and
// teardown deadlines, lost hosts, demand that waits, and slot leaks.
// decide.go is its pure part.
package watchdog

import (
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/berth-ci/berth/events"
)

// FallbackFactor stretches the provisioning and registration deadlines of
// an attempt whose runner is registered with GitHub. At the deadline itself
// the dispatcher deletes the registration, which GitHub refuses while the
// runner runs a job, and releases the slot only once it is gone; the absence
// of an in_progress webhook is no proof (a late webhook would have the VM
// stopped mid-job). The watchdog releases on the deadline alone only this
// much later, for when no dispatcher or no GitHub answers.
const FallbackFactor = 3

// fallback is the deadline the watchdog itself applies to a.
func fallback(a *events.Attempt, d time.Duration) time.Duration {
	if a.Placed && a.RunnerID != 0 {
		return FallbackFactor * d
	}
	return d
}

// Params are the watchdog's deadlines.
type Params struct {
	ProvisionTimeout time.Duration
	// RegistrationTimeout: a runner that started but took no job for this
	// long is broken (GitHub hands an online runner any queued job of its
	// labels, and surplus runners are released anyway), so its slot goes back.
	RegistrationTimeout time.Duration
	TeardownTimeout     time.Duration
	// MaxJobDuration: a job in progress longer than this is over (GitHub
	// ends self-hosted jobs after 5 days of execution): its slot is released
	// and its VM torn down. 0 disables.
	MaxJobDuration     time.Duration
	HostTTL            time.Duration
	DemandWaitingAfter time.Duration
	DemandWaitingEvery time.Duration
	// LeakGrace: a pool whose held slots exceed the live attempts that
	// account for them for this long raises a slot-leak alarm (15 min).
	LeakGrace time.Duration
	// AbandonedCap: a host with this many abandoned VMs is cordoned until a
	// late stop brings it below (default 2: a macOS host's whole capacity).
	AbandonedCap int
	// DegradeAfter placement failures in a row charged to a host (its
	// machine, image or backend) within DegradeWindow mark it degraded
	// (health.go; 0: DefaultDegradeAfter, DefaultDegradeWindow).
	DegradeAfter  int
	DegradeWindow time.Duration
	// NATSFaultAt is not configured: it is the last time, on the
	// watchdog's clock, that NATS failed the watchdog itself (its consumer
	// lost a delivery or stalled; an append, its heartbeat-bucket probe
	// write or a read of the log's end failed), set before each round. A deadline that ran across it is
	// charged to NATS, not to the host or the image (culprit).
	NATSFaultAt time.Time
}

// By marks the facts the watchdog appends on its own authority, so that it
// lifts only the cordons it set, never an operator's.
const By = "watchdog"

// Plan is what the watchdog appends. Releases come first: they end demand
// and must not wait on anything (law 2).
type Plan struct {
	Release  []events.SlotReleased
	Teardown []events.AttemptTeardownRequested
	Abandon  []events.AttemptAbandoned
	Lost     []events.HostLost
	Cordon   []events.HostCordoned
	Uncordon []events.HostUncordoned
	Degrade  []events.HostDegraded
	Recover  []events.HostRecovered
	Demand   []events.DemandWaiting
	Raise    []events.AlarmRaised
	Clear    []events.AlarmCleared
}

// Steps orders the plan for the act shell: releases first (law 2). Facts
// whose ids carry the time (a host lost, a cordon, demand waiting, an
// alarm) are kept from repeating, until the fold shows them, by a key per
// condition.
func (plan Plan) Steps() events.Plan {
	var out events.Plan
	for _, r := range plan.Release {
		out.Add(events.Step{Fact: r, Level: slog.LevelWarn, Msg: "releasing slot",
			Attrs: []any{"attempt", r.Attempt, "pool", r.Pool, "host", r.Host, "reason", r.Reason}})
	}
	for _, p := range plan.Teardown {
		out.Add(events.Fact(p))
	}
	for _, p := range plan.Abandon {
		out.Add(events.Step{Fact: p, Level: slog.LevelWarn, Msg: "teardown overran its deadline; VM abandoned",
			Attrs: []any{"attempt", p.Attempt, "host", p.Host, "after", p.After}})
	}
	for _, p := range plan.Lost {
		out.Add(events.Step{Fact: p, Key: "lost/" + p.Host, Level: slog.LevelWarn, Msg: "host lost",
			Attrs: []any{"host", p.Host, "reason", p.Reason}})
	}
	for _, p := range plan.Cordon {
		out.Add(events.Step{Fact: p, Key: "cordon/" + p.Host, Level: slog.LevelError, Msg: "cordoning host",
			Attrs: []any{"host", p.Host, "reason", p.Reason}})
	}
	for _, p := range plan.Uncordon {
		out.Add(events.Step{Fact: p, Key: "cordon/" + p.Host, Level: slog.LevelInfo, Msg: "lifting cordon",
			Attrs: []any{"host", p.Host, "reason", p.Reason}})
	}
	for _, p := range plan.Degrade {
		out.Add(events.Step{Fact: p, Key: "degraded/" + p.Host, Level: slog.LevelError, Msg: "host degraded",
			Attrs: []any{"host", p.Host, "culprit", p.Culprit, "failures", p.Failures, "reason", p.Reason}})
	}
	for _, p := range plan.Recover {
		out.Add(events.Step{Fact: p, Key: "degraded/" + p.Host, Level: slog.LevelInfo, Msg: "host recovered",
			Attrs: []any{"host", p.Host, "reason", p.Reason}})
	}
	for _, p := range plan.Demand {
		out.Add(events.Step{Fact: p, Key: "demand/" + p.Pool, Level: slog.LevelWarn, Msg: "demand waiting for a slot",
			Attrs: []any{"pool", p.Pool, "jobs", p.Jobs, "oldest_job", p.OldestJobID, "waited", p.Waited.Round(time.Second), "reason", p.Reason}})
	}
	for _, p := range plan.Raise {
		out.Add(events.Step{Fact: p, Key: "alarm/" + p.Key, Level: slog.LevelError, Msg: "alarm",
			Attrs: []any{"key", p.Key, "pool", p.Pool, "message", p.Message}})
	}
	for _, p := range plan.Clear {
		out.Add(events.Step{Fact: p, Key: "alarm/" + p.Key})
	}
	return out
}

// Decide derives the watchdog's facts from the fold at time now. seen maps
// each host to when the watchdog last saw it alive, on the watchdog's own
// clock (liveness.go: a heartbeat change, an announcement, or the start of
// its grace); never a time another machine wrote (law 10). A host missing
// from it has not been watched and is not judged (law 7).
func Decide(f *events.Fleet, now time.Time, seen map[string]time.Time, p Params) Plan {
	var plan Plan
	hosts := make([]string, 0, len(f.Hosts))
	for name := range f.Hosts {
		hosts = append(hosts, name)
	}
	sort.Strings(hosts)
	lost := map[string]bool{}
	for _, name := range hosts {
		h := f.Hosts[name]
		plan.overclaimAlarm(f, h, now)
		if h.State == events.HostStateLost {
			lost[name] = true
			continue
		}
		if last, ok := seen[name]; ok && now.Sub(last) > p.HostTTL {
			lost[name] = true
			plan.Lost = append(plan.Lost, events.HostLost{HostChange: events.HostChange{Host: name, At: now, By: By,
				Reason: fmt.Sprintf("no heartbeat seen for %s (ttl %s); restart its vmagent or check its network", now.Sub(last).Round(time.Second), p.HostTTL)}})
			continue
		}
		plan.abandonedCap(h, now, p.AbandonedCap)
		plan.hostHealth(f, h, now, p)
		plan.imageAlarms(f, h, now)
	}
	plan.gitHubAlarm(f, now)
	// The live index: a terminal attempt (no slot, no VM) has no deadline
	// left, and walking the ones the fold keeps for the retention made
	// Decide's cost grow with history. Of the live attempts, the quiet
	// ones (each holds its slot for a job its runner runs) can only be
	// overdue by the clock, on one of three deadlines, so the fold yields
	// just those whose deadline may have passed (QuietDue): a fleet of
	// 10,000 running jobs no longer costs each round a walk of 10,000
	// attempts. The walk is in no order; what it plans is put in attempt
	// order after it (sortByAttempt), so sorting costs what is acted on,
	// not every live attempt.
	leaks := map[string][]*events.Attempt{}
	for a := range f.UnquietAttempts() {
		plan.judge(f, a, now, lost, leaks, p)
	}
	for a := range f.QuietDue(quietCuts(now, p)) {
		plan.judge(f, a, now, lost, leaks, p)
	}
	plan.sortByAttempt(leaks)
	plan.leakAlarms(f, now, leaks)
	plan.Demand = waiting(f, now, p)
	return plan
}

// quietCuts are the watchdog's deadlines a quiet attempt can overrun, as
// of now: the longest a job may run, a stop's deadline, and the grace of
// a held slot whose VM stopped (judge holds the same comparisons).
func quietCuts(now time.Time, p Params) events.QuietCuts {
	c := events.QuietCuts{Teardown: now.Add(-p.TeardownTimeout), Stopped: now.Add(-p.LeakGrace)}
	if p.MaxJobDuration > 0 {
		c.Started = now.Add(-p.MaxJobDuration)
	}
	return c
}

// judge plans what a's deadlines call for now, and files a under leaks
// when its held slot accounts for no VM.
func (plan *Plan) judge(f *events.Fleet, a *events.Attempt, now time.Time, lost map[string]bool, leaks map[string][]*events.Attempt, p Params) {
	if a.Terminal() {
		return
	}
	ref := events.AttemptRef{Attempt: a.ID, Pool: a.Pool, Host: a.Host}
	bound := f.BoundJob(a.ID)
	switch {
	case a.Held() && bound == 0 && busy(a, now):
		// GitHub said its runner runs a job (its in_progress has not
		// come): no deadline releases it (law 7).
	case a.Held() && lost[a.Host] && lostRelease(a, bound, f.Hosts[a.Host], now, p.HostTTL):
		plan.release(a, events.ReleaseHostLost, p)
	case a.Held() && bound == 0 && !a.RunnerStarted && !a.Failed && provisionOverdue(a, now, fallback(a, p.ProvisionTimeout)):
		plan.release(a, events.ReleaseProvisionTimeout, p)
	case a.Held() && bound == 0 && a.RunnerStarted && p.RegistrationTimeout > 0 && now.Sub(a.RunnerStartedAt) > fallback(a, p.RegistrationTimeout):
		plan.release(a, events.ReleaseRegistration, p)
	case a.Held() && bound != 0 && p.MaxJobDuration > 0 && overran(f.Jobs[bound], now, p.MaxJobDuration):
		plan.release(a, events.ReleaseMaxDuration, p)
	case a.RunsJob() && (bound == 0 || f.Jobs[bound] == nil || f.Jobs[bound].Status != events.StatusCompleted):
		// Its agent keeps the VM while the job runs, whatever
		// teardown was asked for before the binding: no stop overran.
	case a.TeardownReq && !a.Stopped && !a.Abandoned && now.Sub(a.TeardownAt) > p.TeardownTimeout:
		plan.Abandon = append(plan.Abandon, events.AttemptAbandoned{AttemptRef: ref, Step: "stop", After: p.TeardownTimeout})
	}
	// A held slot is accounted for by a live attempt; one whose VM is
	// already stopped accounts for nothing (law 6).
	if a.Held() && a.Stopped && now.Sub(a.StoppedAt) > p.LeakGrace {
		leaks[a.Pool] = append(leaks[a.Pool], a)
	}
}

// sortByAttempt puts what the walk of live attempts planned in attempt
// order: the plan is the same whatever order the fold's index yields.
func (p *Plan) sortByAttempt(leaks map[string][]*events.Attempt) {
	slices.SortFunc(p.Release, func(a, b events.SlotReleased) int { return strings.Compare(a.Attempt, b.Attempt) })
	slices.SortFunc(p.Teardown, func(a, b events.AttemptTeardownRequested) int { return strings.Compare(a.Attempt, b.Attempt) })
	slices.SortFunc(p.Abandon, func(a, b events.AttemptAbandoned) int { return strings.Compare(a.Attempt, b.Attempt) })
	for _, as := range leaks {
		slices.SortFunc(as, func(a, b *events.Attempt) int { return strings.Compare(a.ID, b.ID) })
	}
}

// busy reports whether GitHub called the attempt's runner busy recently:
// within FallbackFactor × RunnerBusyFor of its newest answer (a
// dispatcher asks again every RunnerBusyFor while the deadline stands).
func busy(a *events.Attempt, now time.Time) bool {
	return now.Before(a.BusyUntil(FallbackFactor * events.RunnerBusyFor))
}

// lostRelease says whether a held attempt on a lost host is released now.
// Heartbeat silence is a negative read (law 7): a NATS outage or a
// partition silences a host whose VMs still run their jobs. So an attempt
// whose runner took a job keeps its slot (the job's completed webhook
// releases it; GitHub fails a job whose runner vanished, and MaxJobDuration
// is the backstop), and a registered runner is first deregistered by the
// dispatcher (GitHub refuses with 422 while it runs a job); the watchdog
// releases it on the silence alone only FallbackFactor × HostTTL after the
// host was declared lost. An attempt with no runner registered yet is
// released at once.
func lostRelease(a *events.Attempt, bound int64, h *events.Host, now time.Time, ttl time.Duration) bool {
	switch {
	case bound != 0:
		return false
	case a.Placed && a.RunnerID != 0:
		// Declared lost in this very round, the host's loss is not folded yet.
		return h != nil && h.State == events.HostStateLost && now.Sub(h.StateAt) > FallbackFactor*ttl
	}
	return true
}

// provisionOverdue: the attempt has waited longer than d for its runner,
// counted from its booking, or for a claimed warm VM from its claim; an
// idle warm VM waits for a job, not for a runner, and is never overdue.
func provisionOverdue(a *events.Attempt, now time.Time, d time.Duration) bool {
	since, ok := a.ProvisionClock()
	return ok && now.Sub(since) > d
}

func overran(j *events.Job, now time.Time, limit time.Duration) bool {
	return j != nil && j.Status == events.StatusInProgress && !j.StartedAt.IsZero() && now.Sub(j.StartedAt) > limit
}

// abandonedCap cordons a host at the abandoned-VM cap and lifts its own
// cordon once late stops bring the count back below it.
func (p *Plan) abandonedCap(h *events.Host, now time.Time, limit int) {
	if limit <= 0 {
		return
	}
	switch {
	case h.AbandonedVMs >= limit && !h.Cordoned:
		p.Cordon = append(p.Cordon, events.HostCordoned{HostChange: events.HostChange{Host: h.Name, At: now, By: By,
			Reason: fmt.Sprintf("%d abandoned VMs reached the cap of %d: their stops did not return, so they may still hold the host's physical capacity; "+
				"check the host's backend (for exec: the stop command), then stop them by hand; the cordon lifts by itself when late stops return",
				h.AbandonedVMs, limit)}})
	case h.AbandonedVMs < limit && h.Cordoned && h.CordonBy == By:
		p.Uncordon = append(p.Uncordon, events.HostUncordoned{HostChange: events.HostChange{Host: h.Name, At: now, By: By,
			Reason: fmt.Sprintf("abandoned VMs down to %d, below the cap of %d", h.AbandonedVMs, limit)}})
	}
}

// leakAlarms raises one alarm per pool whose held slots include some that
// no live attempt accounts for, and clears it when none is left. Each pool is
// judged by itself, never against a fleet-wide count.
func (p *Plan) leakAlarms(f *events.Fleet, now time.Time, leaks map[string][]*events.Attempt) {
	pools := make([]string, 0, len(leaks))
	for pool := range leaks {
		pools = append(pools, pool)
	}
	sort.Strings(pools)
	for _, pool := range pools {
		key := events.AlarmSlotLeak + "/" + pool
		if al := f.Alarms[key]; al != nil && al.Active {
			continue
		}
		as := leaks[pool]
		var names []string
		for i, a := range as {
			if i == 5 {
				names = append(names, fmt.Sprintf("and %d more", len(as)-5))
				break
			}
			names = append(names, fmt.Sprintf("%s on %s (stopped %s)", a.ID, a.Host, a.StoppedAt.Format(time.RFC3339)))
		}
		p.Raise = append(p.Raise, events.AlarmRaised{Key: key, Kind: events.AlarmSlotLeak, Pool: pool, At: now,
			Message: fmt.Sprintf("suspected slot leak in pool %s: %d held slots belong to attempts whose VMs stopped: %s; "+
				"check with `berth replay --check`, then release each by hand with `berth release ATTEMPT` if they persist",
				pool, len(as), strings.Join(names, ", "))})
	}
	for key, al := range f.Alarms {
		if al.Active && al.Kind == events.AlarmSlotLeak && len(leaks[al.Pool]) == 0 {
			p.Clear = append(p.Clear, events.AlarmCleared{Key: key, Pool: al.Pool, At: now})
		}
	}
}

// Refusal is what the watchdog's shell refused since it started: facts
// whose stored subject does not confirm their payload or their author.
type Refusal struct {
	Count   uint64
	Seq     uint64
	Subject string
	Reason  string
}

// ForgedAlarm raises one fleet alarm while refused facts exist and none is
// active; it is an incident an operator closes (docs/security.md), so it
// is not cleared by itself.
func ForgedAlarm(f *events.Fleet, now time.Time, r Refusal) []events.AlarmRaised {
	key := events.AlarmForgedFact + "/fleet"
	if r.Count == 0 {
		return nil
	}
	if al := f.Alarms[key]; al != nil && al.Active {
		return nil
	}
	return []events.AlarmRaised{{Key: key, Kind: events.AlarmForgedFact, Pool: "fleet", At: now,
		Message: fmt.Sprintf("%d facts refused: a credential wrote what its role may not say; the last at seq %d on %s: %s; "+
			"no service folded them; find the credential that can publish on that subject, rotate it (docs/security.md), "+
			"and read the parked records with `nats kv ls %s`", r.Count, r.Seq, r.Subject, r.Reason, events.BucketParked)}}
}

func (p *Plan) release(a *events.Attempt, reason string, par Params) {
	p.Release = append(p.Release, events.SlotReleased{Pool: a.Pool, Host: a.Host, Attempt: a.ID, Reason: reason, JobID: a.JobID,
		Culprit: culprit(a, reason, par.NATSFaultAt)})
	if a.Placed && !a.TeardownReq {
		p.Teardown = append(p.Teardown, events.AttemptTeardownRequested{
			AttemptRef: events.AttemptRef{Attempt: a.ID, Pool: a.Pool, Host: a.Host}, Reason: reason})
	}
}

// waiting reports, per pool, queued jobs that have waited for a runner
// longer than DemandWaitingAfter, at most once every DemandWaitingEvery
// (law 6: visible when stuck).
func waiting(f *events.Fleet, now time.Time, p Params) []events.DemandWaiting {
	match := f.NewMatcher()
	type agg struct {
		n      int
		oldest *events.Job
	}
	per := map[string]*agg{}
	for j := range f.OpenJobs() {
		if !j.Demand() || now.Sub(j.QueuedAt) < p.DemandWaitingAfter {
			continue
		}
		pool := match.MatchJob(j)
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
	if len(per) == 0 {
		return nil // nothing waited long: the held slots need no count
	}
	unbound := map[string]int{}
	for a := range f.UnquietAttempts() { // a quiet attempt is bound
		if a.Held() && f.BoundJob(a.ID) == 0 {
			unbound[a.Pool]++
		}
	}
	var out []events.DemandWaiting
	for pool, g := range per {
		// Jobs a booked, still-booting runner will serve are not waiting
		// for a slot.
		if g.n -= unbound[pool]; g.n <= 0 {
			continue
		}
		if last, ok := f.DemandReported[pool]; ok && now.Sub(last) < p.DemandWaitingEvery {
			continue
		}
		reason := "no pool's labels include the job's labels; add a pool or fix runs-on"
		if pool != "unmatched" {
			reason = waitReason(f, pool)
		}
		out = append(out, events.DemandWaiting{Pool: pool, Jobs: g.n, OldestJobID: g.oldest.ID,
			Waited: now.Sub(g.oldest.QueuedAt), Reason: reason, At: now})
	}
	sort.Slice(out, func(i, k int) bool { return out[i].Pool < out[k].Pool })
	return out
}

// waitReason says what keeps a pool's queued jobs from a slot, judged from
// the hosts that offer the pool: a free slot is of no use on a host that is
// cordoned or draining, or whose physical capacity live or abandoned VMs
// fill (BL-01, BL-07: the operator must see why, not "every slot is held").
func waitReason(f *events.Fleet, pool string) string {
	var offered, withdrawn, noRoom int
	for _, h := range f.Hosts {
		ps, ok := h.Pools[pool]
		if !ok || h.State == events.HostStateLost {
			continue
		}
		offered++
		switch {
		case ps.Slots-h.Held[pool] <= 0:
		case !h.Accepts():
			withdrawn++
		case h.PhysicalCap > 0 && h.Booked >= h.PhysicalCap:
			noRoom++
		}
	}
	switch {
	case offered == 0:
		return "no online host offers this pool"
	case withdrawn > 0 && noRoom == 0:
		return "every host with a free slot is cordoned or draining; uncordon one or add a host"
	case noRoom > 0 && withdrawn == 0:
		return "no physical room on any host with a free slot: live or abandoned VMs fill them; see abandoned VMs in `berth status`"
	case noRoom > 0:
		return "every host with a free slot is cordoned, draining, or out of physical room (live or abandoned VMs); see `berth status`"
	}
	return "every slot of the pool is held"
}
