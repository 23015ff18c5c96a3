package events

import (
	"strconv"
	"time"
)

// Attempt is the fold of one placement: its slot and its VM, which are
// bookkept apart (law 2: the slot goes back when demand ends; the VM holds
// physical capacity until it is stopped).
type Attempt struct {
	ID, Pool, Host string
	JobID          int64 // the job it was booked for (a runner may take another: law 8)
	N              int
	Labels         []string

	Reserved, Released bool
	ReleaseReason      string
	// ReleaseCulprit is who the release is charged to (culprit.go), ""
	// for a release that is no failure.
	ReleaseCulprit string
	releases       map[string]struct{}

	Placed         bool
	RunnerID       int64
	SealedJIT      []byte
	SealedBy       string
	SealedTo       string
	Provisioning   bool
	RunnerStarted  bool
	Failed         bool
	FailedStep     string
	FailedError    string
	FailedCulprit  string // who the agent charged the failure to, held to its host (AgentCulprit)
	TeardownReq    bool
	TeardownReason string
	Stopped        bool
	StoppedLate    bool
	StopEnded      string // how the stop ended it (AttemptStopped.Ended)
	Abandoned      bool
	AbandonedStep  string
	Deregistered   bool // its runner registration is gone from GitHub
	// BoundJobID is the job its runner took, as the dispatcher recorded
	// it on the attempt's own subject (AttemptBound): what an agent's fold,
	// which never sees job facts, knows of the binding. JobEnded: that job
	// is over (AttemptBound with Ended, or a teardown asked for its
	// completion or its maximum duration). OperatorTeardown: an operator
	// asked for the teardown (a teardown stored on the cli role).
	BoundJobID                 int64
	JobEnded, OperatorTeardown bool
	// RunnerBusyAt is when GitHub last refused to delete its runner
	// because it runs a job (AttemptRunnerBusy).
	RunnerBusyAt time.Time
	// Image and RunnerVersion are what its agent reported its runner
	// booted (AttemptRunnerVersion); RunnerRefused: GitHub refused that
	// runner for its version (AttemptRunnerRefused, image.go).
	Image, RunnerVersion string
	RunnerRefused        bool
	// Warm VM (issue 8): booked without a job; Ready once booted; Claimed
	// by a job; Assigned its JIT config.
	Warm, Ready, Claimed, Assigned bool
	ReadyAt, ClaimedAt, AssignedAt time.Time

	ReservedAt, ReleasedAt, PlacedAt, ProvisioningAt time.Time
	// BookedSeq is the stream sequence of the ledger fact that holds the
	// slot: the booking, or a warm VM's claim (what a sealed placement
	// names, package sealing).
	BookedSeq uint64
	// ReservedSeq and ReleasedSeq are the stream sequences of its first
	// booking and its first release: where a job's timeline finds its
	// slot facts, which stand on the pool's subject among every job's.
	ReservedSeq, ReleasedSeq              uint64
	RunnerStartedAt, FailedAt, TeardownAt time.Time
	StoppedAt, AbandonedAt, LastAt        time.Time
}

// Held reports whether the attempt holds a slot of its pool.
func (a *Attempt) Held() bool { return a.Reserved && !a.Released }

// VMLive reports whether the attempt's VM may exist: from provisioning until
// stopped. An abandoned VM is live: it still occupies physical capacity.
func (a *Attempt) VMLive() bool { return a.Provisioning && !a.Stopped }

// RunsJob reports whether the attempt's own facts say its VM runs a job
// that has not ended and no operator asked for its teardown: such a VM is
// stopped only by its job's end or an operator, whatever its create step
// reported or a deadline says (issue 17).
func (a *Attempt) RunsJob() bool { return a.BoundJobID != 0 && !a.JobEnded && !a.OperatorTeardown }

// BusyUntil is when a runner GitHub last called busy stops being left
// alone, waiting after each answer for; zero when GitHub never did.
func (a *Attempt) BusyUntil(wait time.Duration) time.Time {
	if a.RunnerBusyAt.IsZero() {
		return time.Time{}
	}
	return a.RunnerBusyAt.Add(wait)
}

// Booked reports whether the attempt occupies its host's physical capacity:
// it holds a slot (its VM is coming) or its VM exists.
func (a *Attempt) Booked() bool { return (a.Held() && !a.Stopped) || a.VMLive() }

// Releases is how many distinct releases were applied (more than 1 is a
// violation of "every reservation is released at most once").
func (a *Attempt) Releases() int { return len(a.releases) }

// Stage names the attempt's furthest step, for status and logs.
func (a *Attempt) Stage() string {
	switch {
	case a.Stopped:
		return "stopped"
	case a.Abandoned:
		return "abandoned"
	case a.TeardownReq:
		return "teardown"
	case a.Failed:
		return "failed"
	case a.RunnerStarted:
		return "running"
	case a.Warm && a.Claimed:
		return "assigned"
	case a.Warm && a.Ready:
		return "idle"
	case a.Warm:
		return "warming"
	case a.Provisioning:
		return "provisioning"
	case a.Placed:
		return "placed"
	case a.Reserved:
		return "reserved"
	}
	return "unknown"
}

// Terminal reports whether nothing more will happen to the attempt.
func (a *Attempt) Terminal() bool {
	return !a.Held() && !a.VMLive() && (a.Stopped || !a.Placed)
}

// Only a release charged to the job itself counts against its attempts
// (Job.FailedAttempts; law 11, culprit.go: CountsAgainstJob).

type contribution struct {
	held, booked, live, abandoned bool
	failed                        bool
}

func (a *Attempt) contribution() contribution {
	return contribution{
		held:      a.Held(),
		booked:    a.Booked(),
		live:      a.VMLive(),
		abandoned: a.Abandoned && !a.Stopped,
		failed:    a.Released && CountsAgainstJob(a.ReleaseReason, a.ReleaseCulprit),
	}
}

// attempt returns the attempt record, filling in identity fields from ref.
func (f *Fleet) attempt(id, pool, host string) *Attempt {
	f.markAttempt(id)
	a, ok := f.Attempts[id]
	if !ok {
		a = &Attempt{ID: id}
		f.Attempts[id] = a
	}
	if a.Pool == "" && pool != "" {
		a.Pool = pool
		// Every pool an attempt names has its record, in whatever order
		// the facts came: the operator's status lists it (view.go) from
		// the records, not from a walk over every attempt.
		f.pool(pool)
	}
	if a.Host == "" {
		a.Host = host
	}
	return a
}

// DropSealedJIT makes the fold keep no sealed JIT config, and forget those
// it holds: only the agent that creates an attempt's VM opens one
// (vmagent), and a live attempt's config costs its size in every fold that
// keeps it (about 600 bytes in the bench, whose simulator mints small
// configs; GitHub's hold the runner's credential files and are larger).
func (f *Fleet) DropSealedJIT() {
	f.noSealed = true
	for _, a := range f.Attempts {
		a.SealedJIT, a.SealedBy, a.SealedTo = nil, "", ""
	}
}

// KeepsSealedJIT reports whether the fold keeps sealed JIT configs.
func (f *Fleet) KeepsSealedJIT() bool { return !f.noSealed }

// touch applies mutate to an attempt and moves its counters from its old
// contribution to its new one, so every counter is exact under any order.
func (f *Fleet) touch(a *Attempt, at time.Time, mutate func()) {
	before := a.contribution()
	pool, host, job := a.Pool, a.Host, a.JobID
	mutate()
	if at.After(a.LastAt) {
		a.LastAt = at
	}
	if a.Terminal() || f.noSealed {
		// Its VM is gone and no create will read the sealed JIT config
		// again; every fold keeps the attempt for the retention (72 h),
		// and the config is most of its bytes (law 5). A fold that never
		// creates a VM drops it at once (DropSealedJIT).
		a.SealedJIT, a.SealedBy, a.SealedTo = nil, "", ""
	}
	f.count(before, pool, host, job, -1)
	f.count(a.contribution(), a.Pool, a.Host, a.JobID, +1)
}

func (f *Fleet) count(c contribution, pool, host string, job int64, d int) {
	if c.held && pool != "" {
		f.pool(pool).Held += d
		if host != "" {
			f.host(host).Held[pool] += d
		}
	}
	if host != "" {
		h := f.host(host)
		if c.booked {
			h.Booked += d
			if pool != "" {
				h.BookedIn[pool] += d
			}
		}
		if c.live {
			h.LiveVMs += d
		}
		if c.abandoned {
			h.AbandonedVMs += d
		}
	}
	if c.failed && job != 0 && !f.Settled(job) {
		f.job(job).FailedAttempts += d
	}
}

func releaseKey(e Event, reason string) string {
	return strconv.FormatUint(e.Seq, 10) + "/" + reason
}
