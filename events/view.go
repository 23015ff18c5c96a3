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
	Name          string         `json:"name"`
	State         HostState      `json:"state"`
	Cordoned      bool           `json:"cordoned"`
	CordonReason  string         `json:"cordon_reason,omitempty"`
	CordonBy      string         `json:"cordoned_by,omitempty"`
	PhysicalCap   int            `json:"physical_cap"`
	LiveVMs       int            `json:"live_vms"`
	AbandonedVMs  int            `json:"abandoned_vms"`
	Slots         map[string]int `json:"slots"`
	Held          map[string]int `json:"held"`
	LastHeartbeat *time.Time     `json:"last_heartbeat"`
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
	Key      string    `json:"key"`
	Kind     string    `json:"kind"`
	Pool     string    `json:"pool"`
	Message  string    `json:"message"`
	RaisedAt time.Time `json:"raised_at"`
}

// Status derives the operator's view from the projection.
func (f *Fleet) Status() Status {
	labels := f.PoolLabels()
	match := NewMatcher(labels)
	pools := map[string]*PoolStatus{}
	poolOf := func(name string) *PoolStatus {
		p, ok := pools[name]
		if !ok {
			p = &PoolStatus{Name: name, Labels: labels[name], Capacity: f.Capacity(name),
				CordonedHosts: []string{}, Alarms: []string{}, HeldBy: []HeldSlot{}}
			pools[name] = p
		}
		return p
	}
	for name := range labels {
		poolOf(name)
	}
	for name := range f.Pools {
		poolOf(name)
	}
	unbound := map[string]int{}
	st := Status{AsOfSeq: f.LastSeq, Skipped: f.Skipped, Alarms: []AlarmView{}, Abandoned: []AbandonedVM{}}
	for _, a := range f.Attempts {
		if a.Pool == "" {
			continue
		}
		p := poolOf(a.Pool)
		if a.Abandoned && !a.Stopped {
			p.AbandonedVMs++
			st.Abandoned = append(st.Abandoned, AbandonedVM{a.ID, a.Pool, a.Host, a.AbandonedStep, a.AbandonedAt})
		}
		if !a.Held() {
			continue
		}
		p.Held++
		bound := f.BoundJob(a.ID)
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
		if bound == 0 {
			unbound[a.Pool]++
		}
		p.HeldBy = append(p.HeldBy, HeldSlot{Attempt: a.ID, Host: a.Host, Stage: a.Stage(), JobID: a.JobID, Bound: bound})
	}
	for _, j := range f.Jobs {
		switch {
		case j.Unschedulable && j.Status < StatusInProgress:
			st.Jobs.Unschedulable++
		case j.Status == StatusWaiting:
			st.Jobs.Waiting++
		case j.Status == StatusQueued:
			st.Jobs.Queued++
			if name := match.MatchJob(j); name != "" {
				poolOf(name).PendingDemand++
			} else {
				st.Jobs.Unmatched++
			}
		case j.Status == StatusInProgress:
			st.Jobs.InProgress++
		case j.Status == StatusCompleted:
			st.Jobs.Completed++
		}
	}
	for _, h := range f.Hosts {
		hs := HostStatus{Name: h.Name, State: h.State, Cordoned: h.Cordoned, CordonReason: h.CordonReason, CordonBy: h.CordonBy,
			PhysicalCap: h.PhysicalCap, LiveVMs: h.LiveVMs, AbandonedVMs: h.AbandonedVMs,
			Slots: map[string]int{}, Held: map[string]int{}}
		for name, ps := range h.Pools {
			hs.Slots[name] = ps.Slots
			hs.Held[name] = h.Held[name]
			if h.Cordoned {
				p := poolOf(name)
				p.CordonedHosts = append(p.CordonedHosts, h.Name)
			}
		}
		st.Hosts = append(st.Hosts, hs)
	}
	for _, a := range f.Alarms {
		if !a.Active {
			continue
		}
		st.Alarms = append(st.Alarms, AlarmView{a.Key, a.Kind, a.Pool, a.Message, a.RaisedAt})
		if a.Pool != "" {
			p := poolOf(a.Pool)
			p.Alarms = append(p.Alarms, a.Key)
		}
	}
	for _, p := range pools {
		if w := p.PendingDemand - unbound[p.Name]; w > 0 {
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
