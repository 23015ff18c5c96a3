package events

import (
	"strings"
	"time"
)

// JobStatus only moves forward: waiting < queued < in_progress < completed,
// whatever order the webhooks arrive in.
type JobStatus int

const (
	StatusUnknown JobStatus = iota
	StatusWaiting
	StatusQueued
	StatusInProgress
	StatusCompleted
)

func (s JobStatus) String() string {
	return [...]string{"unknown", "waiting", "queued", "in_progress", "completed"}[s]
}

// Job is the fold of one GitHub job's facts.
type Job struct {
	ID, RunID, RunAttempt int64
	Org, Repo, Name       string
	Labels                []string
	Installation          string // the GitHub installation it came from (JobRef.Installation)
	Status                JobStatus
	Conclusion            string
	Runner                string // runner that took it, from in_progress / completed
	QueuedAt              time.Time
	StartedAt             time.Time
	CompletedAt           time.Time
	Unschedulable         bool
	UnschedulableReason   string
	Minted                int // highest attempt number booked for this job
	FailedAttempts        int // attempts booked for it that ended without a runner taking any job
	// Conflict is the runner GitHub said took this job while that runner
	// is bound to another job (BL-17); ConflictRecorded: a JobConflict
	// fact says so.
	Conflict         string
	ConflictRecorded bool
	// AlsoOn is a second runner GitHub reported the job in progress on
	// (its first is Runner): bound to the job too, so neither runner is
	// torn down while it runs; a JobConflict records it.
	AlsoOn string

	labelKey string    // Labels joined, set with them: what matching keys on
	counted  jobBucket // the status figure the live index counts it under (live.counts)
}

// LabelKey is the job's labels as one canonical string (LabelKey of its
// labels), kept from the fold so matching a job to its pool allocates
// nothing.
func (j *Job) LabelKey() string {
	if j.labelKey == "" && len(j.Labels) > 0 {
		return strings.Join(j.Labels, ",") // a record built by hand
	}
	return j.labelKey
}

// Demand reports whether the job is waiting for a runner: queued, not taken,
// not given up on; or reported in progress on a runner bound to another job
// (an ephemeral runner runs one job: the job gets a VM of its own).
func (j *Job) Demand() bool {
	return (j.Status == StatusQueued || (j.Status == StatusInProgress && j.Conflict != "")) && !j.Unschedulable
}

// HostState is the liveness of a host: the fact stored last in the log wins
// (by stream sequence, never by its time).
type HostState string

const (
	HostStateOnline   HostState = "online"
	HostStateDraining HostState = "draining"
	HostStateLost     HostState = "lost"
)

// Host is the fold of one host's facts plus the attempts placed on it.
type Host struct {
	Name string
	Boot string
	// Pools and PhysicalCap are what the fold offers the host: its claim
	// (Claim, ClaimCap: its newest HostOnline) within its grant (Grant:
	// the admin's newest HostGranted), Offer. Overclaim says how the
	// claim exceeds the grant; a host without a grant is offered nothing.
	Pools       map[string]PoolSlots
	PhysicalCap int
	Claim       map[string]PoolSlots `json:",omitempty"`
	ClaimCap    int                  `json:",omitempty"`
	Grant       *HostGranted         `json:",omitempty"`
	Overclaim   []string             `json:",omitempty"`
	CurveKey    string
	Backend     string
	State       HostState
	StateAt     time.Time // event time of the fact that set State
	// DrainedBy is who began the drain State says (from the fact's
	// subject): an operator's (cli) drain ends with an operator's
	// uncordon; an agent's own (SIGTERM) ends when it announces again.
	DrainedBy    Role
	DrainReason  string // the drain's reason (HostDraining.Reason), while State is draining
	Cordoned     bool
	CordonReason string
	CordonBy     string // who cordoned: an operator, or "watchdog" for the abandoned-VM cap
	CordonedAt   time.Time
	Assign       bool           // its backend can keep warm VMs (HostOnline.Assign)
	Held         map[string]int // pool → slots held on this host
	LiveVMs      int            // VMs that exist (provisioning … stopped), abandoned ones included
	AbandonedVMs int            // abandoned and not yet seen stopped
	Booked       int            // attempts holding a slot or a VM: what physical placement must count
	BookedIn     map[string]int // pool → its booked attempts: what the shapes' resources count (HostFits)
	Resources    Resources      // what its VMs' shapes share (HostOnline.Resources)
	OnlineAt     time.Time      // the time on the advertisement stored last (display only)
	// Health is what the log says about its recent placements (law 11):
	// failures charged to it, successes, and a degradation.
	Health HostHealth
	// Images is what the log says of the runners each image starts here
	// (image.go), by image name (ImageOf); nil until one reports.
	Images map[string]*ImageHealth

	online, state, cordon, grant stamp
}

// Accepts reports whether new placements may go to the host.
func (h *Host) Accepts() bool { return h.State == HostStateOnline && !h.Cordoned }

// Pool is the slot ledger of one pool.
type Pool struct {
	Name       string
	Held       int
	LastSeq    uint64 // stream sequence of the last fact on the pool's subject
	WarmMinted int    // highest warm VM number booked in this pool
}

// Alarm is an alarm's latest state.
type Alarm struct {
	Key, Kind, Pool, Message string
	RaisedAt                 time.Time
	Active                   bool
	last                     stamp
}

// Fleet is the projection every service folds from the log. Apply is pure,
// idempotent and insensitive to the order of events (each field is either a
// forward-only state, a set flag, or last-writer-wins by stream sequence), so a
// replay, a duplicate or a late redelivery cannot move it backwards.
type Fleet struct {
	Jobs     map[int64]*Job
	Attempts map[string]*Attempt
	Hosts    map[string]*Host
	Pools    map[string]*Pool
	Alarms   map[string]*Alarm
	// DemandReported is the time of the last demand-waiting report per pool.
	DemandReported map[string]time.Time
	// Deliveries holds the GitHub delivery ids (X-GitHub-Delivery) of the
	// job facts stored, with the fact's time: what the dispatcher must not
	// ask GitHub to redeliver. Compact keeps them for DeliveryMemory (GitHub
	// redelivers for 3 days) or the retention, whichever is longer, so it
	// grows with deliveries of the last days, not with history.
	Deliveries map[string]time.Time
	// GitHub is GitHub's part in the fleet's failures (law 11).
	GitHub GitHubHealth
	// LastSeq is the highest stream sequence applied.
	LastSeq uint64
	// Skipped counts events of unknown types.
	Skipped int
	// Applied counts events applied (duplicates included).
	Applied int

	byRunner map[string]int64 // runner name → job it took
	live     live             // what deciders still act on (live.go)
	labels   poolLabels       // each pool's runner labels, kept from the hosts' announcements
	history  history          // the ids of jobs and attempts that are over (history.go)
	sawJobs  bool             // a job fact was folded: this fold binds runners to jobs
	noSealed bool             // this fold keeps no sealed JIT configs (DropSealedJIT)
}

// NewFleet returns an empty projection.
func NewFleet() *Fleet {
	return &Fleet{
		Jobs:           map[int64]*Job{},
		Attempts:       map[string]*Attempt{},
		Hosts:          map[string]*Host{},
		Pools:          map[string]*Pool{},
		Alarms:         map[string]*Alarm{},
		DemandReported: map[string]time.Time{},
		Deliveries:     map[string]time.Time{},
		byRunner:       map[string]int64{},
		history:        newHistory(),
	}
}

// stamp orders facts for last-writer-wins fields (host state, its
// announcement and cordon, alarms): the stream sequence decides, so the
// fact the log stored last wins (law 10: order comes from the log, never
// from a writer's clock; a HostLost stamped an hour ahead must not outlive
// the re-announcements stored after it). A fact's own time is data for
// display and deadlines, not a key. Time, then id, only break ties between
// facts without a sequence (folded by hand, in tests), so any permutation
// of the same facts still folds the same.
type stamp struct {
	at  time.Time
	seq uint64
	id  string
}

func stampOf(e Event) stamp { return stamp{e.Time, e.Seq, e.ID} }

func (s stamp) after(o stamp) bool {
	if s.seq != o.seq {
		return s.seq > o.seq
	}
	if !s.at.Equal(o.at) {
		return s.at.After(o.at)
	}
	return s.id > o.id
}

func (f *Fleet) job(id int64) *Job {
	f.markJob(id)
	j, ok := f.Jobs[id]
	if ok && j.Runner != "" && f.byRunner[j.Runner] == id {
		f.markAttempt(j.Runner) // whether its attempt is quiet follows the job's status
	}
	if ok && j.AlsoOn != "" && f.byRunner[j.AlsoOn] == id {
		f.markAttempt(j.AlsoOn)
	}
	if !ok {
		j = &Job{ID: id}
		f.Jobs[id] = j
	}
	return j
}

func (f *Fleet) host(name string) *Host {
	f.markHost(name)
	h, ok := f.Hosts[name]
	if !ok {
		h = &Host{Name: name, Held: map[string]int{}, BookedIn: map[string]int{}, Pools: map[string]PoolSlots{}}
		f.Hosts[name] = h
	}
	return h
}

func (f *Fleet) pool(name string) *Pool {
	p, ok := f.Pools[name]
	if !ok {
		p = &Pool{Name: name}
		f.Pools[name] = p
	}
	return p
}

// BoundJob is the job whose runner name is the attempt id, or 0: the only
// binding of an attempt to a job that GitHub confirms (law 8).
func (f *Fleet) BoundJob(attempt string) int64 { return f.byRunner[attempt] }

// Capacity is the slots all known, not lost hosts offer a pool.
func (f *Fleet) Capacity(pool string) int {
	n := 0
	for _, h := range f.Hosts {
		if h.State == HostStateLost {
			continue
		}
		n += h.Pools[pool].Slots
	}
	return n
}

// PoolLabels maps each advertised pool to its runner labels (from the hosts
// that offer it; the newest advertisement wins). It is kept by the fold:
// built on first use and again only after a host's announcement changed a
// pool, so a decision round does not walk every host. The map is shared:
// callers must not modify it.
func (f *Fleet) PoolLabels() map[string][]string {
	if !f.labels.ok {
		f.labels.byPool, f.labels.installs = f.scanPoolLabels()
		f.labels.match, f.labels.ok = nil, true
	}
	return f.labels.byPool
}

// PoolInstallations maps each advertised pool whose installation is named
// to it (PoolSlots.Installation); a pool it leaves out serves the unnamed
// installation. Kept and shared like PoolLabels.
func (f *Fleet) PoolInstallations() map[string]string {
	f.PoolLabels()
	return f.labels.installs
}

// NewMatcher is a fresh Matcher over the advertised pools, their labels
// and installations: MatchJob serves a job only from its installation's
// pools. A caller off the fold's loop needs its own (a Matcher caches).
func (f *Fleet) NewMatcher() *Matcher {
	return NewMatcherIn(f.PoolLabels(), f.PoolInstallations())
}

// scanPoolLabels is PoolLabels and PoolInstallations from a walk over
// every host.
func (f *Fleet) scanPoolLabels() (map[string][]string, map[string]string) {
	out, installs := map[string][]string{}, map[string]string{}
	newest := map[string]stamp{}
	for _, h := range f.Hosts {
		for name, ps := range h.Pools {
			if s, ok := newest[name]; !ok || h.online.after(s) {
				out[name], newest[name] = ps.Labels, h.online
				if ps.Installation != "" {
					installs[name] = ps.Installation
				} else {
					delete(installs, name)
				}
			}
		}
	}
	return out, installs
}

// poolLabels caches PoolLabels and a Matcher over them; gen counts the
// changes, so an index keyed by pool (live.go) knows to re-match.
type poolLabels struct {
	ok       bool
	gen      uint64
	byPool   map[string][]string
	installs map[string]string // pool → installation, when named
	match    *Matcher
}

// poolsChanged drops the cached pool labels: a host announced other pools.
func (f *Fleet) poolsChanged() {
	f.labels.ok = false
	f.labels.gen++
}

// matcher is a Matcher over PoolLabels, kept with them.
func (f *Fleet) matcher() *Matcher {
	f.PoolLabels() // drops a matcher over pools a host has since changed
	if f.labels.match == nil {
		f.labels.match = f.NewMatcher()
	}
	return f.labels.match
}
