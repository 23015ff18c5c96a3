package events

import (
	"sort"
	"time"
)

// Status is the operator's view of the fleet (the `berth status --json`
// contract): per pool and per host, plus totals. Field names are stable.
type Status struct {
	AsOfSeq uint64       `json:"as_of_seq"`
	Pools   []PoolStatus `json:"pools"`
	Hosts   []HostStatus `json:"hosts"`
	Jobs    JobCounts    `json:"jobs"`
	Alarms  []AlarmView  `json:"alarms"`
	// Abandoned lists every VM whose step overran its deadline and that has
	// not been seen stopped since: it still occupies its host (law 3).
	Abandoned []AbandonedVM `json:"abandoned"`
	Skipped   int           `json:"skipped_events"`
	// StreamDrift is how the stream differs from the config `berth status
	// --config` was given (absent without one): the admin's to fix with
	// `berth stream apply`, never the services'.
	StreamDrift []string `json:"stream_drift,omitempty"`
	// GitHub says whether GitHub refused the App's own credentials since
	// its last placement: calls pause and jobs wait as demand (law 11).
	GitHub GitHubStatus `json:"github"`
}

// GitHubStatus is GitHub's part in the fleet's failures, from the log.
type GitHubStatus struct {
	Refused bool       `json:"refused"`
	Since   *time.Time `json:"refused_since,omitempty"`
}

// AbandonedVM is one abandoned VM.
type AbandonedVM struct {
	Attempt string    `json:"attempt"`
	Pool    string    `json:"pool"`
	Host    string    `json:"host"`
	Step    string    `json:"step"`
	Since   time.Time `json:"since"`
}

// PoolStatus is one pool. Held slots are listed beside the attempts that
// account for them (law 6).
type PoolStatus struct {
	Name           string     `json:"name"`
	Labels         []string   `json:"labels"`
	Capacity       int        `json:"capacity"`
	Held           int        `json:"held"`
	Running        int        `json:"running"`
	Provisioning   int        `json:"provisioning"`
	PendingDemand  int        `json:"pending_demand"`
	WaitingForSlot int        `json:"waiting_for_slot"`
	AbandonedVMs   int        `json:"abandoned_vms"`
	CordonedHosts  []string   `json:"cordoned_hosts"`
	Alarms         []string   `json:"alarms"`
	HeldBy         []HeldSlot `json:"held_by"`
	// Warm VMs (issue 8): booting with no job (warming), booted and
	// waiting (idle), and claimed by a job (assigned; also counted as
	// running or provisioning).
	WarmWarming  int `json:"warm_warming"`
	WarmIdle     int `json:"warm_idle"`
	WarmAssigned int `json:"warm_assigned"`
}

// HeldSlot is one held slot and the attempt that accounts for it.
type HeldSlot struct {
	Attempt string `json:"attempt"`
	Host    string `json:"host"`
	Stage   string `json:"stage"`
	JobID   int64  `json:"job_id"`
	Bound   int64  `json:"bound_job_id,omitempty"`
}

// HostStatus is one host. LastHeartbeat is filled in by the caller from the
// heartbeat bucket (heartbeats are not events).
type HostStatus struct {
	Name         string    `json:"name"`
	State        HostState `json:"state"`
	Cordoned     bool      `json:"cordoned"`
	CordonReason string    `json:"cordon_reason,omitempty"`
	CordonBy     string    `json:"cordoned_by,omitempty"`
	// DrainReason is why the host drains (berth drain --reason), while it does.
	DrainReason   string         `json:"drain_reason,omitempty"`
	PhysicalCap   int            `json:"physical_cap"`
	LiveVMs       int            `json:"live_vms"`
	AbandonedVMs  int            `json:"abandoned_vms"`
	Slots         map[string]int `json:"slots"`
	Held          map[string]int `json:"held"`
	LastHeartbeat *time.Time     `json:"last_heartbeat"`
	// ClockSkewSeconds is the agent's clock minus the NATS server's when
	// it stored the last heartbeat (negative: the agent is behind), filled
	// by `berth status`; the watchdog reports its own measure in /healthz
	// and berth_host_clock_skew_seconds. Shown, never acted on (law 10).
	ClockSkewSeconds *float64 `json:"clock_skew_seconds,omitempty"`
	// Degraded: the watchdog marked the host (HostDegraded): its
	// placements keep failing for Culprit (host, image or backend).
	Degraded        bool   `json:"degraded,omitempty"`
	DegradedCulprit string `json:"degraded_culprit,omitempty"`
	DegradedReason  string `json:"degraded_reason,omitempty"`
	// Ungranted: no admin granted the host (HostGranted), so it is offered
	// nothing; Overclaim: how its announcement exceeds its grant (Offer).
	Ungranted bool     `json:"ungranted,omitempty"`
	Overclaim []string `json:"overclaim,omitempty"`
}

// JobCounts counts jobs the projection still holds, by status.
type JobCounts struct {
	Waiting       int `json:"waiting"`
	Queued        int `json:"queued"`
	InProgress    int `json:"in_progress"`
	Completed     int `json:"completed"`
	Unschedulable int `json:"unschedulable"`
	Unmatched     int `json:"unmatched"`
}

// AlarmView is one active alarm.
type AlarmView struct {
	Key  string `json:"key"`
	Kind string `json:"kind"`
	// Culprit is what the alarm's kind charges (AlarmCulprit, law 11).
	Culprit  string    `json:"culprit,omitempty"`
	Pool     string    `json:"pool"`
	Message  string    `json:"message"`
	RaisedAt time.Time `json:"raised_at"`
}

// Status derives the operator's view from the projection. It reads each of
// the fold's maps once, in the order the counts depend on: attempts first
// (held slots, and which of them are still unbound), then jobs (pending
// demand), hosts, alarms, and last the per-pool figures that combine them.
func (f *Fleet) Status() Status { return f.status(true) }

// StatusCounts is Status without the list of held slots: every pool's
// HeldBy is empty, and every count is as Status gives it. Metrics and
// health read it once a second; at 10,000 held slots the list, built and
// sorted, was most of what a status cost.
func (f *Fleet) StatusCounts() Status { return f.status(false) }

func (f *Fleet) status(slots bool) Status {
	f.settle()
	b := newStatusBuilder(f)
	b.slots = slots
	b.addAttempts()
	b.addJobs()
	b.addHosts()
	b.addAlarms()
	b.st.Jobs.Completed += f.history.jobs.len() // over, kept as ids (history.go)
	return b.finish()
}

// statusBuilder accumulates one Status. Pools are created on first mention,
// so a pool that only an attempt, a job, a host or an alarm names still
// appears in the view.
type statusBuilder struct {
	f      *Fleet
	labels map[string][]string
	match  *Matcher
	pools  map[string]*PoolStatus
	// unbound counts, per pool, held slots not yet bound to a job: queued
	// demand beyond them is waiting for a slot.
	unbound map[string]int
	st      Status
	// slots: list each held slot in its pool's HeldBy.
	slots bool
}

func newStatusBuilder(f *Fleet) *statusBuilder {
	labels := f.PoolLabels()
	b := &statusBuilder{f: f, labels: labels, match: f.NewMatcher(),
		pools: map[string]*PoolStatus{}, unbound: map[string]int{},
		st: Status{AsOfSeq: f.LastSeq, Skipped: f.Skipped, Alarms: []AlarmView{}, Abandoned: []AbandonedVM{}}}
	// Every configured pool is listed, even one nothing refers to yet.
	for name := range labels {
		b.pool(name)
	}
	for name := range f.Pools {
		b.pool(name)
	}
	return b
}

// pool returns the named pool's entry, creating it with empty (not nil)
// lists so the JSON contract always has arrays.
func (b *statusBuilder) pool(name string) *PoolStatus {
	p, ok := b.pools[name]
	if !ok {
		p = &PoolStatus{Name: name, Labels: b.labels[name], Capacity: b.f.Capacity(name),
			CordonedHosts: []string{}, Alarms: []string{}, HeldBy: []HeldSlot{}}
		b.pools[name] = p
	}
	return p
}

// addAttempts counts abandoned VMs and held slots, and lists each held slot
// beside the attempt that accounts for it (law 6). It walks the live
// index's shown attempts, not every record the fold keeps.
func (b *statusBuilder) addAttempts() {
	for _, a := range b.f.live.shown {
		b.addAttempt(a)
	}
}

// addAttempt counts one attempt that names a pool: as an abandoned VM if
// no stop is recorded, and as a held slot if it holds one.
func (b *statusBuilder) addAttempt(a *Attempt) {
	p := b.pool(a.Pool)
	if a.Abandoned && !a.Stopped {
		p.AbandonedVMs++
		b.st.Abandoned = append(b.st.Abandoned, AbandonedVM{a.ID, a.Pool, a.Host, a.AbandonedStep, a.AbandonedAt})
	}
	if !a.Held() {
		return
	}
	p.Held++
	bound := b.f.BoundJob(a.ID)
	countHeld(p, a, bound)
	if bound == 0 {
		b.unbound[a.Pool]++
	}
	if b.slots {
		p.HeldBy = append(p.HeldBy, HeldSlot{Attempt: a.ID, Host: a.Host, Stage: a.Stage(), JobID: a.JobID, Bound: bound})
	}
}

// countHeld classifies one held slot: its warm-pool state, and whether it
// is running a job or still provisioning.
func countHeld(p *PoolStatus, a *Attempt, bound int64) {
	switch {
	case a.Warm && a.Claimed:
		p.WarmAssigned++
	case a.Warm && a.Ready:
		p.WarmIdle++
	case a.Warm:
		p.WarmWarming++
	}
	switch {
	case a.Warm && !a.Claimed: // waits for a job, not for a runner: neither running nor provisioning
	case a.RunnerStarted || bound != 0:
		p.Running++
	default:
		p.Provisioning++
	}
}

// addJobs takes the jobs' counts by status from the live index, and files
// each queued job as demand on the pool its labels match, or unmatched if
// none does: a queued job is open (live.jobs), so this walks the backlog,
// not every job the fold keeps.
func (b *statusBuilder) addJobs() {
	b.st.Jobs = b.f.live.counts
	for _, j := range b.f.live.jobs {
		if j.Status != StatusQueued || j.Unschedulable {
			continue
		}
		if name := b.match.MatchJob(j); name != "" {
			b.pool(name).PendingDemand++
		} else {
			b.st.Jobs.Unmatched++
		}
	}
}

// addHosts lists each host with its per-pool slots and holds, and names a
// cordoned host on every pool it serves.
func (b *statusBuilder) addHosts() {
	for _, h := range b.f.Hosts {
		hs := HostStatus{Name: h.Name, State: h.State, Cordoned: h.Cordoned, CordonReason: h.CordonReason, CordonBy: h.CordonBy,
			DrainReason: h.drainReason(),
			PhysicalCap: h.PhysicalCap, LiveVMs: h.LiveVMs, AbandonedVMs: h.AbandonedVMs,
			Slots: map[string]int{}, Held: map[string]int{},
			Degraded: h.Health.Degraded, DegradedCulprit: h.Health.Culprit, DegradedReason: h.Health.Reason,
			Ungranted: h.Grant == nil, Overclaim: h.Overclaim}
		if h.State == "" {
			continue // granted, never announced: nothing to show yet
		}
		for name, ps := range h.Pools {
			hs.Slots[name] = ps.Slots
			hs.Held[name] = h.Held[name]
			if h.Cordoned {
				p := b.pool(name)
				p.CordonedHosts = append(p.CordonedHosts, h.Name)
			}
		}
		b.st.Hosts = append(b.st.Hosts, hs)
	}
}

// addAlarms lists active alarms, and names each on its pool if it has one.
func (b *statusBuilder) addAlarms() {
	for _, a := range b.f.Alarms {
		if !a.Active {
			continue
		}
		b.st.Alarms = append(b.st.Alarms, AlarmView{Key: a.Key, Kind: a.Kind, Culprit: AlarmCulprit(a.Kind), Pool: a.Pool, Message: a.Message, RaisedAt: a.RaisedAt})
		if a.Pool != "" {
			p := b.pool(a.Pool)
			p.Alarms = append(p.Alarms, a.Key)
		}
	}
}

// finish derives waiting-for-slot (queued demand the unbound held slots do
// not cover) and sorts every list, so that the view does not depend on map
// order.
func (b *statusBuilder) finish() Status {
	st := b.st
	if g := b.f.GitHub; g.Refusing() {
		at := g.Refused.At
		st.GitHub = GitHubStatus{Refused: true, Since: &at}
	}
	for _, p := range b.pools {
		if w := p.PendingDemand - b.unbound[p.Name]; w > 0 {
			p.WaitingForSlot = w
		}
		sort.Slice(p.HeldBy, func(i, j int) bool { return p.HeldBy[i].Attempt < p.HeldBy[j].Attempt })
		sort.Strings(p.CordonedHosts)
		sort.Strings(p.Alarms)
		st.Pools = append(st.Pools, *p)
	}
	sort.Slice(st.Pools, func(i, j int) bool { return st.Pools[i].Name < st.Pools[j].Name })
	sort.Slice(st.Hosts, func(i, j int) bool { return st.Hosts[i].Name < st.Hosts[j].Name })
	sort.Slice(st.Alarms, func(i, j int) bool { return st.Alarms[i].Key < st.Alarms[j].Key })
	sort.Slice(st.Abandoned, func(i, j int) bool { return st.Abandoned[i].Attempt < st.Abandoned[j].Attempt })
	return st
}

// drainReason is the reason of the drain h is in, "" when it is not.
func (h *Host) drainReason() string {
	if h.State != HostStateDraining {
		return ""
	}
	return h.DrainReason
}
