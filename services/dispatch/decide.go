// Package dispatch is the dispatcher: GitHub intake, slot booking, JIT
// minting, placement and release. decide.go is its pure part.
package dispatch

import (
	"cmp"
	"iter"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/berth-ci/berth/events"
)

// Plan is what the dispatcher should append (and mint) given the fold. Each
// item is keyed by a deterministic id, so acting on the same plan twice is
// harmless (law 9).
type Plan struct {
	// Reserve books slots, in order, per pool (appended with the pool
	// ledger's expected last sequence).
	Reserve []events.SlotReserved
	// Mint lists booked attempts that still need a JIT config and a placement.
	Mint []*events.Attempt
	// Deregister lists surplus attempts whose runner registration exists
	// (they were placed): the registration is deleted through the API first,
	// and the slot released only when GitHub confirms (204 or 404). GitHub
	// refuses (422) for a runner that took a job whose in_progress has not
	// arrived yet; a lagging webhook is not a fact (law 7).
	Deregister []*events.Attempt
	// Cleanup lists released attempts whose runner never ran a job and is
	// still registered: their registration is deleted, best effort.
	Cleanup []*events.Attempt
	// Release gives back slots whose demand ended; Teardown asks agents to
	// stop VMs whose slot is released. A release never waits for a teardown.
	Release  []events.SlotReleased
	Teardown []events.AttemptTeardownRequested
	// Claim binds idle warm VMs to queued jobs (pool ledger, expected
	// sequence), before anything is minted for them; Place boots warm VMs
	// (no JIT config).
	Claim []events.AttemptClaimed
	Place []events.AttemptPlaced
	// Unschedulable gives up on jobs that failed too many placements.
	Unschedulable []events.JobUnschedulable
	// Conflicts records jobs GitHub reported on a runner bound to another
	// job (BL-17), such a job stays demand and is booked a VM of its own;
	// or on a second runner, which is bound to it too.
	Conflicts []events.JobConflict
	// Bound records on an attempt's own subject that its runner took a
	// job, and later that the job ended: the agent's fold has no job
	// facts, and a VM that runs a job is stopped only by its end or an
	// operator.
	Bound []events.AttemptBound
}

// MintCall asks GitHub for a booked attempt's JIT config, then places the
// attempt (or hands a claimed warm VM its config).
type MintCall struct{ Attempt string }

// CallKey implements events.Call.
func (c MintCall) CallKey() string { return c.Attempt + "/mint" }

// DeregisterCall deletes an attempt's runner registration on GitHub; once
// GitHub confirms, the fact AttemptDeregistered lets Decide release it.
type DeregisterCall struct{ Attempt string }

// CallKey implements events.Call.
func (c DeregisterCall) CallKey() string { return c.Attempt + "/deregister" }

// Steps orders the plan for the act shell: releases first (law 2), then
// teardowns, give-ups and conflicts, then bookings (each booking's mint
// right behind it, in the same round), warm boots, and GitHub calls last.
func (plan Plan) Steps() events.Plan {
	var out events.Plan
	for _, r := range plan.Release {
		out.Add(events.Fact(r))
	}
	for _, b := range plan.Bound {
		out.Add(events.Fact(b))
	}
	for _, t := range plan.Teardown {
		out.Add(events.Fact(t))
	}
	for _, u := range plan.Unschedulable {
		out.Add(events.Fact(u))
	}
	for _, c := range plan.Conflicts {
		out.Add(events.Step{Fact: c, Level: slog.LevelWarn,
			Msg:   "GitHub reported a job on a runner that runs another job; the runner keeps its first job and this job gets a VM of its own (BL-17)",
			Attrs: []any{"job", c.JobID, "runner", c.Runner, "runner_job", c.BoundJob}})
	}
	for _, c := range plan.Claim {
		out.Add(events.Fact(c))
	}
	for _, r := range plan.Reserve {
		st := events.Fact(r)
		if !r.Warm { // a warm VM is booted, not minted for
			st.Then = []events.Step{events.Do(MintCall{r.Attempt})}
		}
		out.Add(st)
	}
	for _, p := range plan.Place {
		out.Add(events.Fact(p))
	}
	for _, a := range plan.Mint {
		out.Add(events.Do(MintCall{a.ID}))
	}
	for _, a := range plan.Deregister {
		out.Add(events.Do(DeregisterCall{a.ID}))
	}
	for _, a := range plan.Cleanup {
		out.Add(events.Do(DeregisterCall{a.ID}))
	}
	return out
}

// DefaultMaxAttempts is how many failed placements a job gets by default
// (garm retries a failed create 5 times; ARC a failed pod 5 times).
const DefaultMaxAttempts = 5

// Params tunes Decide.
type Params struct {
	// MaxAttempts is the number of failed placements after which a job is
	// unschedulable.
	MaxAttempts int
	// RegistrationTimeout and ProvisionTimeout are the watchdog's
	// deadlines (config watchdog.*): a placed runner that started and took
	// no job for RegistrationTimeout, or did not start within
	// ProvisionTimeout of its booking, is deregistered through the API
	// (GitHub refuses with 422 while the runner runs a job: that is what
	// tells, not the absence of an in_progress webhook) and, once gone,
	// released. 0 leaves it to the watchdog.
	RegistrationTimeout, ProvisionTimeout time.Duration
	// Now is when the plan is made (the dispatcher sets it every round).
	Now time.Time
	// Warm is each pool's warm target (issue 8); a pool without one keeps
	// no warm VM.
	Warm map[string]WarmPool
	// MaxUnminted caps, per pool, the booked attempts that wait for their
	// JIT config; 0 or less means no cap (the dispatcher makes 0
	// UnmintedPerCall × MintConcurrency; give -1 there for none). The
	// provisioning deadline runs from the booking, so bookings made faster
	// than the JIT-config calls can follow
	// would expire in the queue and be booked again (10,000 jobs at once on
	// 500 hosts did): the rest of the backlog stays demand until a
	// placement frees room, oldest first as always.
	MaxUnminted int
	// Blocked: GitHub said to wait (a rate limit); the plan books, mints
	// and deregisters nothing until it allows calls again, except that
	// pools Exempt says yes for still book and mint.
	Blocked bool
	// Exempt, when set, names the pools whose bookings spend nothing of
	// the REST budget a rate limit stopped: a runner scale set's pools,
	// whose JIT configs come from the actions service (its own limits).
	Exempt func(pool string) bool
	// Waits, when set, names the pools whose installation GitHub told to
	// wait (a deregistration of another installation's runner goes on);
	// nil: every pool waits.
	Waits func(pool string) bool
	// Refused holds the attempts whose JIT config GitHub refused (or held
	// back with a rate limit, or refused the App's credentials) → the
	// release reason: the dispatcher's shell observes the answer, the plan
	// releases the slot, charged to the reason's culprit (events.ReleaseCulprit).
	Refused map[string]string
	// ProbeAfter is the first back-off before a degraded host gets a probe
	// placement; it doubles with each failed probe up to ProbeMax (0:
	// DefaultProbeAfter, DefaultProbeMax). Measured on Now.
	ProbeAfter, ProbeMax time.Duration
}

// Back-off of probe placements on a degraded host (law 11).
const (
	DefaultProbeAfter = 30 * time.Second
	DefaultProbeMax   = 10 * time.Minute
)

// Expired names the deadline a placed, unbound attempt has passed
// (ReleaseRegistration or ReleaseProvisionTimeout), or ReleaseHostLost when
// its host was declared lost, or "".
func (p Params) Expired(f *events.Fleet, a *events.Attempt) string {
	if h := f.Hosts[a.Host]; h != nil && h.State == events.HostStateLost {
		return events.ReleaseHostLost
	}
	switch {
	case p.Now.IsZero():
	case a.RunnerStarted && p.RegistrationTimeout > 0 && p.Now.Sub(a.RunnerStartedAt) > p.RegistrationTimeout:
		return events.ReleaseRegistration
	case !a.RunnerStarted && p.ProvisionTimeout > 0:
		if since, ok := a.ProvisionClock(); ok && p.Now.Sub(since) > p.ProvisionTimeout {
			return events.ReleaseProvisionTimeout
		}
	}
	return ""
}

// Decide derives the dispatcher's next facts from the fold. It is pure.
//
// Demand is counted per pool (law 8): GitHub hands a runner any queued job
// whose labels it has, so a pool needs as many unbound runners (booked
// attempts no job has taken yet) as it has queued jobs; it books the
// difference, oldest jobs first, and releases the surplus when a job is
// cancelled or taken by a runner that is not ours.
func Decide(f *events.Fleet, p Params) Plan { return decide(f, p, foldDemand{f}) }

// demandSource is where a round reads demand and the hosts a booking may
// go to: the fold's indexes (foldDemand), or, in tests, a full scan that
// the indexes must equal (DecideByScan).
type demandSource interface {
	// count is how many jobs wait for a runner in pool; oldest yields
	// them oldest first (queued time, then id).
	count(pool string) int
	oldest(pool string) iter.Seq[*events.Job]
	// conflicts yields, in any order, the jobs a JobConflict is due for.
	conflicts() iter.Seq[*events.Job]
	// shapeless yields, in any order, the jobs in demand that match no
	// pool and name a machine shape (unknownShape judges each).
	shapeless() iter.Seq[*events.Job]
	// hosts are at least the hosts with room in pool, for pickHost.
	hosts(pool string) roomFor
}

// roomFor is where a booking in a pool may go, as the fold had it when the
// round began (the round's own bookings are counted apart, in booked and
// heldNow): ranked holds the hosts with room that are not degraded, best
// first by events.RoomRank, each with the rank it was filed under, so
// that pickHost stops at the first that cannot beat what it found;
// degraded holds those whose machine or image is degraded (each takes a
// probe at most).
type roomFor struct {
	ranked   []events.RoomEntry
	degraded map[string]*events.Host
}

// foldDemand reads demand from the indexes the fold keeps, so a round
// costs what changed, not the backlog (issue 19).
type foldDemand struct{ f *events.Fleet }

func (d foldDemand) count(pool string) int                    { return d.f.DemandCount(pool) }
func (d foldDemand) oldest(pool string) iter.Seq[*events.Job] { return d.f.DemandOldest(pool) }
func (d foldDemand) conflicts() iter.Seq[*events.Job]         { return d.f.ConflictJobs() }
func (d foldDemand) shapeless() iter.Seq[*events.Job]         { return d.f.ShapelessJobs() }
func (d foldDemand) hosts(pool string) roomFor {
	return roomFor{ranked: d.f.HostsByRoom(pool), degraded: d.f.DegradedWithRoom(pool)}
}

func decide(f *events.Fleet, p Params, demand demandSource) Plan {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	pl := &planner{f: f, p: p, demand: demand, labels: f.PoolLabels(), unbound: map[string][]*events.Attempt{},
		warm: map[string][]*events.Attempt{}, ownUnbound: map[int64]bool{}, expiring: map[string]bool{},
		unminted: map[string]int{}, failedNow: map[int64]int{}, booked: map[string]int{}, heldNow: map[[2]string]int{},
		starting: map[string]int{}, unboundAt: map[[2]string]int{}, rooms: map[string]roomFor{}}
	pl.probe = pl.probeDue // once a round: a method value handed on is an allocation
	pl.conflicts()
	pl.unknownShapes()
	for a := range f.UnquietAttempts() {
		pl.attempt(a)
	}
	pl.plan.inAttemptOrder()
	for _, as := range pl.unbound {
		byID(as)
	}
	for _, as := range pl.warm {
		byID(as)
	}
	pools := make([]string, 0, len(pl.labels))
	for name := range pl.labels {
		pools = append(pools, name)
	}
	sort.Strings(pools)
	var refills []func()
	for _, pool := range pools {
		free := pl.warm[pool]
		claimOrder(free)
		free = pl.book(pool, free)
		if _, kept := p.Warm[pool]; kept || len(free) > 0 {
			// After every pool's demand: jobs come before warm VMs.
			refills = append(refills, func() { pl.plan.refill(f, p, pool, pl.labels[pool], free, pl.booked, pl.heldNow, pl.candidates) })
		}
	}
	for _, refill := range refills {
		refill()
	}
	pl.plan.withoutReleased()
	if p.Blocked {
		// GitHub said to wait: call it for nothing until it allows calls
		// again (no bookings to mint for, no mints, no deregistrations);
		// demand waits (BL-12, BL-37). An exempt pool's bookings and
		// mints call another API: they go on. Each pool's bookings are
		// its own ledger's, so dropping another pool's leaves them whole.
		blocked := func(pool string) bool { return p.Exempt == nil || !p.Exempt(pool) }
		pl.plan.Reserve = slices.DeleteFunc(pl.plan.Reserve, func(r events.SlotReserved) bool { return blocked(r.Pool) })
		pl.plan.Mint = slices.DeleteFunc(pl.plan.Mint, func(a *events.Attempt) bool { return blocked(a.Pool) })
		waits := func(a *events.Attempt) bool { return p.Waits == nil || p.Waits(a.Pool) }
		pl.plan.Deregister = slices.DeleteFunc(pl.plan.Deregister, waits)
		pl.plan.Cleanup = slices.DeleteFunc(pl.plan.Cleanup, waits)
	}
	return pl.plan
}

// planner is one Decide round's working state.
type planner struct {
	f      *events.Fleet
	p      Params
	plan   Plan
	labels map[string][]string
	demand demandSource // queued jobs per pool
	// unbound: booked attempts no job has taken yet (supply) per pool;
	// warm: free warm VMs per pool (booting or idle, no job claimed).
	unbound, warm map[string][]*events.Attempt
	ownUnbound    map[int64]bool  // jobs with a runner of their own booked
	expiring      map[string]bool // past a deadline, deregistration planned
	unminted      map[string]int  // booked or claimed, no JIT config yet
	failedNow     map[int64]int   // job → failed attempts this plan releases
	booked        map[string]int  // host → attempts booked in this plan
	heldNow       map[[2]string]int
	starting      map[string]int     // host → held attempts whose runner has not started (a probe in flight)
	unboundAt     map[[2]string]int  // host, pool → held attempts no job took (an image's probe in flight)
	rooms         map[string]roomFor // pool → where its bookings may go
	probe         func(h *events.Host, pool string) bool
}

// candidates are where a booking in pool may go (roomFor), read once a
// round.
func (pl *planner) candidates(pool string) roomFor {
	r, ok := pl.rooms[pool]
	if !ok {
		r = pl.demand.hosts(pool)
		pl.rooms[pool] = r
	}
	return r
}

// conflicts records jobs GitHub reported on a runner bound to another job,
// or on a second runner, in job order.
func (pl *planner) conflicts() {
	for j := range pl.demand.conflicts() {
		runner := j.Conflict
		if runner == "" || j.Status != events.StatusInProgress {
			runner = j.AlsoOn // in progress on two runners
		}
		pl.plan.Conflicts = append(pl.plan.Conflicts, events.JobConflict{JobID: j.ID, Runner: runner, BoundJob: pl.f.BoundJob(runner)})
	}
	slices.SortFunc(pl.plan.Conflicts, func(a, b events.JobConflict) int { return cmp.Compare(a.JobID, b.JobID) })
}

// unknownShapes gives up, with the reason, on jobs that ask for a machine
// shape no pool offers (never silently the default machine), in job order.
func (pl *planner) unknownShapes() {
	for j := range pl.demand.shapeless() {
		if u, ok := unknownShape(j, pl.labels); ok {
			pl.plan.Unschedulable = append(pl.plan.Unschedulable, u)
		}
	}
	slices.SortFunc(pl.plan.Unschedulable, func(a, b events.JobUnschedulable) int { return cmp.Compare(a.JobID, b.JobID) })
}

// attempt decides what one unquiet attempt needs. Quiet attempts (held for
// a job that runs) need nothing: the walk leaves them out. The rest come
// in map order, and sorting them each round cost 5 ms with 10,000
// running: what the walk collects is put in id order after it instead,
// which yields the same plan.
func (pl *planner) attempt(a *events.Attempt) {
	f, plan := pl.f, &pl.plan
	bound := f.BoundJob(a.ID)
	if r, ok := pl.released(a, bound); ok {
		plan.Release = append(plan.Release, r)
		if events.CountsAgainstJob(r.Reason, r.Culprit) {
			pl.failedNow[a.JobID]++ // booked again in this round: count it now
		}
	} else {
		pl.unreleased(a, bound)
		if a.Held() && !a.RunnerStarted && !a.Failed && !a.Abandoned {
			pl.starting[a.Host]++
		}
		if a.Held() && bound == 0 {
			pl.unboundAt[[2]string{a.Host, a.Pool}]++
		}
	}
	if b, ok := binding(f, a, bound); ok {
		plan.Bound = append(plan.Bound, b)
	}
	if a.Warm && a.Held() && !a.Placed && !a.TeardownReq {
		plan.Place = append(plan.Place, warmPlacement(a))
	}
	// A released runner that never ran a job leaves a registration
	// behind (GitHub removes only runners that ran their job): delete
	// it, so it can take no job and does not linger offline.
	if a.Released && a.Placed && a.RunnerID != 0 && !a.Deregistered && bound == 0 {
		plan.Cleanup = append(plan.Cleanup, a)
	}
}

// binding is the AttemptBound fact the attempt's own subject lacks: that
// its runner took a job (law 8: from the runner name GitHub reported),
// or, when no teardown for the job's end will say it, that the job
// completed. Only while its VM may run: a stopped VM has nothing left to
// protect.
func binding(f *events.Fleet, a *events.Attempt, bound int64) (events.AttemptBound, bool) {
	ref := events.AttemptRef{Attempt: a.ID, Pool: a.Pool, Host: a.Host}
	done := f.Jobs[bound] != nil && f.Jobs[bound].Status == events.StatusCompleted
	switch {
	case a.Stopped || bound == 0 || a.JobEnded:
	case a.BoundJobID == 0 && !done:
		return events.AttemptBound{AttemptRef: ref, JobID: bound}, true
	case a.BoundJobID != 0 && done && (a.TeardownReq || (a.Released && !endsJob(a.ReleaseReason))):
		// Its teardown was asked for before the binding (a create that
		// failed before the in_progress came), for a reason that does
		// not end the job: the agent keeps the VM until told.
		return events.AttemptBound{AttemptRef: ref, JobID: a.BoundJobID, Ended: true}, true
	}
	return events.AttemptBound{}, false
}

// endsJob: a teardown for this release reason tells the agent the job ended.
func endsJob(reason string) bool {
	return reason == events.ReleaseCompleted || reason == events.ReleaseMaxDuration
}

// busy reports whether GitHub called the attempt's runner busy (it runs a
// job whose in_progress webhook has not come) within RunnerBusyFor: it is
// then neither deregistered nor released on a deadline or a drain.
func (p Params) busy(a *events.Attempt) bool {
	until := a.BusyUntil(events.RunnerBusyFor)
	return !until.IsZero() && (p.Now.IsZero() || p.Now.Before(until))
}

// released says whether a held attempt's demand has ended, and why. Every
// release is derived here, from the fold (and the mint answers the shell
// observed), so a release whose append was lost is simply decided again.
func (pl *planner) released(a *events.Attempt, bound int64) (events.SlotReleased, bool) {
	f, p := pl.f, pl.p
	if !a.Held() {
		return events.SlotReleased{}, false
	}
	switch {
	case bound != 0 && f.Jobs[bound] != nil && f.Jobs[bound].Status == events.StatusCompleted:
		return release(a, events.ReleaseCompleted), true
	case a.Failed && a.FailedStep == events.StepDrain:
		return release(a, events.ReleaseHostDraining), true
	case bound != 0:
		return events.SlotReleased{}, false
	case hostWithdrawn(f, a) != "" && !p.busy(a):
		// A cordon or a drain takes back bookings that have no VM yet
		// (BL-32: a decision made before the cordon is stale after it),
		// and a drain also idle runners, which GitHub would otherwise
		// hand a new job. Neither spends the job's attempts.
		return release(a, hostWithdrawn(f, a)), true
	case a.Failed || (a.Abandoned && !a.RunnerStarted):
		// Only while no job is bound: a runner that already took a job
		// keeps its slot until that job completes, whatever its create
		// step reported. A create that failed or overran its deadline
		// ends this attempt's claim on demand; its VM, if any, stays
		// counted on the host until it is seen stopped. It is charged to
		// the host (or to what the agent named), never to the job.
		return charged(release(a, events.ReleaseCreateFailed), failedCulprit(a)), true
	case a.RunnerRefused:
		// GitHub refused its runner's version: it exits without taking a
		// job, and so would the next of its image. The image's fault, never
		// the job's: the job stays demand, and the image is booked on that
		// host only as a probe (probeDue) until it works again.
		return charged(release(a, events.ReleaseRunnerRefused), events.CulpritImage), true
	case a.Placed && a.Deregistered:
		// GitHub confirmed its runner gone (a deadline or a surplus
		// deregistration): nothing can take a job on it any more.
		reason := p.Expired(f, a)
		if reason == "" {
			reason = events.ReleaseSurplus
		}
		return charged(release(a, reason), expiredCulprit(a, reason)), true
	case p.Refused[a.ID] != "" && (!a.Placed || (a.Warm && !a.Assigned)):
		// GitHub refused its JIT config, or said to wait: the slot goes
		// back and the job is booked again (BL-12). A refusal for the
		// job's own repository or labels is the job's; a refusal of the
		// App's credentials or a rate limit is GitHub's.
		reason := p.Refused[a.ID]
		return charged(release(a, reason), events.ReleaseCulprit(reason)), true
	}
	return events.SlotReleased{}, false
}

// unreleased sorts a held, unbound attempt into supply, deregistration,
// mints or warm VMs; a released one into teardown.
func (pl *planner) unreleased(a *events.Attempt, bound int64) {
	f, p, plan := pl.f, pl.p, &pl.plan
	switch {
	case a.Held() && bound != 0:
	case a.Held() && a.Placed && a.RunnerID != 0 && !a.Deregistered && p.Expired(f, a) != "" && p.busy(a):
		// GitHub said its runner runs a job: left alone, still supply.
		pl.unbound[a.Pool] = append(pl.unbound[a.Pool], a)
		pl.ownUnbound[a.JobID] = true
	case a.Held() && a.Placed && a.RunnerID != 0 && !a.Deregistered && p.Expired(f, a) != "":
		// Past its deadline with no job seen. Whether its runner took
		// one is GitHub's to say (a late in_progress webhook is not a
		// fact): deleting the registration is refused while it runs a
		// job, and only a deleted runner's slot is released. Until then
		// it still counts as its pool's supply, so its job is not booked
		// twice at once.
		plan.Deregister = append(plan.Deregister, a)
		pl.expiring[a.ID] = true
		pl.unbound[a.Pool] = append(pl.unbound[a.Pool], a)
		pl.ownUnbound[a.JobID] = true
	case a.Held() && a.WarmFree():
		// A warm VM no job claimed: not supply (no runner exists for
		// it), a VM a queued job can claim.
		pl.warm[a.Pool] = append(pl.warm[a.Pool], a)
	case a.Held():
		pl.unbound[a.Pool] = append(pl.unbound[a.Pool], a)
		pl.ownUnbound[a.JobID] = true
		switch {
		case a.Warm && a.Ready && !a.Assigned: // claimed and booted: mint its JIT config
			plan.Mint = append(plan.Mint, a)
		case !a.Warm && !a.Placed:
			plan.Mint = append(plan.Mint, a)
		}
		if (a.Warm && a.Claimed && !a.Assigned) || (!a.Warm && !a.Placed) {
			pl.unminted[a.Pool]++
		}
	case a.Released && a.Placed && !a.TeardownReq && !a.Stopped:
		plan.Teardown = append(plan.Teardown, teardown(a, a.ReleaseReason))
	}
}

// book matches one pool's demand with its supply: it gives back surplus
// runners, or books slots (claiming free warm VMs first) for the jobs no
// runner serves, oldest first. It returns the warm VMs left free.
func (pl *planner) book(pool string, free []*events.Attempt) []*events.Attempt {
	jobs, supply := pl.demand.count(pool), pl.unbound[pool]
	if surplus := len(supply) - jobs; surplus > 0 {
		pl.giveBack(supply, surplus)
		return free
	}
	need := jobs - len(supply)
	if need <= 0 {
		return free
	}
	for j := range pl.demand.oldest(pool) {
		if need == 0 {
			break
		}
		if pl.ownUnbound[j.ID] {
			// A job with a runner of its own booked needs nothing more;
			// the runner may take another job (law 8), which is why it
			// counts in need but is not booked again.
			continue
		}
		if pl.p.MaxUnminted > 0 && pl.unminted[pool] >= pl.p.MaxUnminted {
			break // the JIT-config calls are behind: the rest waits as demand
		}
		var ok bool
		if free, ok = pl.bookJob(pool, j, free); !ok {
			break // no free slot or physical room: the job stays demand
		}
		need--
	}
	return free
}

// giveBack releases (or, when registered, deregisters) the surplus
// runners that cost least to lose.
func (pl *planner) giveBack(supply []*events.Attempt, surplus int) {
	for _, a := range leastAdvanced(supply, surplus) {
		if pl.expiring[a.ID] || pl.p.busy(a) {
			continue // already planned; or GitHub said it runs a job
		}
		if a.Placed && a.RunnerID != 0 && !a.Deregistered {
			pl.plan.Deregister = append(pl.plan.Deregister, a)
		} else {
			pl.plan.Release = append(pl.plan.Release, release(a, events.ReleaseSurplus))
		}
	}
}

// bookJob serves one waiting job: unschedulable after MaxAttempts
// placements failed for the job's own fault (law 11: only those count), else an idle (or booting) warm VM claimed by a fact before
// anything is minted (no job waits for a cold boot while one exists), else
// a fresh slot on the best host. ok is false when no host has room.
func (pl *planner) bookJob(pool string, j *events.Job, free []*events.Attempt) (rest []*events.Attempt, ok bool) {
	plan := &pl.plan
	if failed := j.FailedAttempts + pl.failedNow[j.ID]; failed >= pl.p.MaxAttempts {
		plan.Unschedulable = append(plan.Unschedulable, events.JobUnschedulable{
			JobID: j.ID, Attempts: failed,
			Reason: "GitHub refused a runner for this job's repository or labels on every placement (the job's own fault: " +
				"failures charged to a host, an image, a backend or GitHub never count); check runs-on and the App's access to the repository"})
		return free, true
	}
	if len(free) > 0 {
		a := free[0]
		plan.Claim = append(plan.Claim, events.AttemptClaimed{Pool: pool, Host: a.Host, Attempt: a.ID, JobID: j.ID})
		pl.unminted[pool]++
		return free[1:], true
	}
	host := pickHost(pl.candidates(pool), pool, pl.booked, pl.heldNow, false, pl.probe)
	if host == "" {
		return free, false
	}
	pl.booked[host]++
	pl.heldNow[[2]string{host, pool}]++
	n := j.Minted + 1
	plan.Reserve = append(plan.Reserve, events.SlotReserved{
		Pool: pool, Host: host, Attempt: events.AttemptID(j.ID, n), JobID: j.ID, N: n, Labels: pl.labels[pool]})
	pl.unminted[pool]++
	return free, true
}

// withoutReleased drops, from what the plan mints and boots, the attempts
// it releases: no runner registration and no VM without a held slot (law 1).
func (plan *Plan) withoutReleased() {
	if len(plan.Release) == 0 {
		return
	}
	gone := map[string]bool{}
	for _, r := range plan.Release {
		gone[r.Attempt] = true
	}
	var mint []*events.Attempt
	for _, a := range plan.Mint {
		if !gone[a.ID] {
			mint = append(mint, a)
		}
	}
	plan.Mint = mint
	var place []events.AttemptPlaced
	for _, pl := range plan.Place {
		if !gone[pl.Attempt] {
			place = append(place, pl)
		}
	}
	plan.Place = place
}

// hostWithdrawn says why an unbound attempt's host no longer takes it, or "".
func hostWithdrawn(f *events.Fleet, a *events.Attempt) string {
	h := f.Hosts[a.Host]
	switch {
	case h == nil:
		return ""
	case h.State == events.HostStateDraining:
		return events.ReleaseHostDraining
	case h.Cordoned && !a.Placed:
		return events.ReleaseHostCordoned
	}
	return ""
}

// pickHost returns the accepting host with the most free slots in pool and
// physical room, or "". Ties go to the host with the shorter run of failed
// placements (law 11: work spreads away from a host whose last placement
// failed), then to the name that sorts first. A degraded host is left out
// unless probe says a probe placement is due there, and then it comes
// first: its one probe proves it healthy or not (nil: degraded hosts are
// left out). So is a host whose image for pool is degraded (GitHub refused
// its runners' version, events.ImageHealth). warm asks for a host whose
// backend can keep warm VMs; only, when set, considers that host alone.
// It walks the degraded hosts, then the ranked ones until one's rank
// cannot beat the best found: the round's own bookings only lower a
// host's rank, so none after it can (issue 19: a booking among 500 hosts
// walked all 500: 43–76 µs a round, BenchmarkDecide/wide).
func pickHost(room roomFor, pool string, booked map[string]int, heldNow map[[2]string]int, warm bool,
	probe func(h *events.Host, pool string) bool, only ...string) string {
	p := picker{pool: pool, booked: booked, heldNow: heldNow, warm: warm, probe: probe}
	if len(only) > 0 {
		p.only = only[0]
	}
	for _, h := range room.degraded {
		p.consider(h)
	}
	if p.best.probe {
		return p.best.name
	}
	for _, e := range room.ranked {
		if p.best.name != "" && !(hostRank{free: e.Rank.Free, streak: e.Rank.Streak, name: e.Host.Name}).better(p.best) {
			break
		}
		p.consider(e.Host)
	}
	return p.best.name
}

// picker is one pickHost call: what it judges hosts by, and the best
// found so far.
type picker struct {
	pool    string
	booked  map[string]int
	heldNow map[[2]string]int
	warm    bool
	probe   func(h *events.Host, pool string) bool
	only    string
	best    hostRank
}

// consider judges h as pickHost says, and keeps it if it is the best yet:
// its rank as the fold files it (events.Host.RankForRoom), less what this
// round booked there.
func (p *picker) consider(h *events.Host) {
	name, pool := h.Name, p.pool
	rank, ok := h.RankForRoom(pool)
	if !ok || (p.warm && !h.Assign) || (p.only != "" && name != p.only) {
		return
	}
	free := rank.Free - p.heldNow[[2]string{name, pool}]
	room := h.PhysicalCap - h.Booked - p.booked[name]
	if free <= 0 || room <= 0 || !fitsShape(h, pool, p.heldNow) {
		return
	}
	r := hostRank{free: free, streak: rank.Streak, name: name}
	if rank.Degraded {
		if p.probe == nil || !p.probe(h, pool) {
			return
		}
		r.probe = true
	}
	if p.best.name == "" || r.better(p.best) {
		p.best = r
	}
}

// hostRank orders the hosts a booking may go to (pickHost).
type hostRank struct {
	probe        bool
	free, streak int
	name         string
}

func (a hostRank) better(b hostRank) bool {
	switch {
	case a.probe != b.probe:
		return a.probe
	case a.free != b.free:
		return a.free > b.free
	case a.streak != b.streak:
		return a.streak < b.streak
	}
	return a.name < b.name
}

// probeDue reports whether a degraded host, or a host whose image for pool
// is degraded, may take a probe placement of pool now: nothing is booked
// there this round, and each degradation's own probe is due (hostProbeDue,
// imageProbeDue).
func (pl *planner) probeDue(h *events.Host, pool string) bool {
	if pl.p.Now.IsZero() || pl.booked[h.Name] > 0 {
		return false
	}
	return (!h.Health.Degraded || pl.hostProbeDue(h)) && pl.imageProbeDue(h, pool)
}

// hostProbeDue: no probe is in flight on the degraded host (held with no
// runner started yet), and the back-off since it was degraded, or since
// its last failed probe, is over: ProbeAfter doubled per failed probe, at
// most ProbeMax, measured on the plan's Now.
func (pl *planner) hostProbeDue(h *events.Host) bool {
	if pl.starting[h.Name] > 0 {
		return false
	}
	failed, last := h.Health.FailedSince(h.Health.Since)
	from := h.Health.Since.At
	if last.At.After(from) {
		from = last.At
	}
	return pl.p.Now.Sub(from) >= pl.backoff(failed)
}

// imageProbeDue: the image pool boots on h is not degraded; or no runner of
// pool there waits for a job (a probe in flight) and the back-off since
// GitHub's last refusal is over: ProbeAfter doubled per refusal after the
// first, at most ProbeMax.
func (pl *planner) imageProbeDue(h *events.Host, pool string) bool {
	img := h.ImageDegraded(pool)
	if img == nil {
		return true
	}
	if pl.unboundAt[[2]string{h.Name, pool}] > 0 {
		return false
	}
	return pl.p.Now.Sub(img.LastRefused().At) >= pl.backoff(img.RefusalsSinceAccepted()-1)
}

// backoff is ProbeAfter doubled n times, at most ProbeMax (defaults
// DefaultProbeAfter, DefaultProbeMax).
func (pl *planner) backoff(n int) time.Duration {
	first, most := pl.p.ProbeAfter, pl.p.ProbeMax
	if first <= 0 {
		first = DefaultProbeAfter
	}
	if most <= 0 {
		most = DefaultProbeMax
	}
	wait := first
	for ; n > 0 && wait < most; n-- {
		wait *= 2
	}
	return min(wait, most)
}

// failedCulprit is who a failed or abandoned create is charged to: what
// the agent named if an agent may name it (events.AgentCulprit: also for a
// snapshot folded before that rule), else the host.
func failedCulprit(a *events.Attempt) string {
	if a.Failed {
		return events.AgentCulprit(a.FailedCulprit)
	}
	return events.CulpritHost
}

// expiredCulprit is who a deregistered runner's release is charged to: a
// runner that started and never took a job, its image; one that never
// started on its host, the host; a surplus runner, nobody.
func expiredCulprit(a *events.Attempt, reason string) string {
	switch reason {
	case events.ReleaseRegistration:
		return events.CulpritImage
	case events.ReleaseProvisionTimeout, events.ReleaseHostLost:
		return events.CulpritHost
	}
	return ""
}

// charged names the culprit a release is charged to.
func charged(r events.SlotReleased, culprit string) events.SlotReleased {
	r.Culprit = culprit
	return r
}

// leastAdvanced picks n attempts to give back, those that cost least to
// lose first: not placed, then not started, newest first.
func leastAdvanced(as []*events.Attempt, n int) []*events.Attempt {
	rank := func(a *events.Attempt) int {
		switch {
		case !a.Placed:
			return 0
		case !a.RunnerStarted:
			return 1
		}
		return 2
	}
	out := append([]*events.Attempt(nil), as...)
	sort.SliceStable(out, func(i, k int) bool {
		if rank(out[i]) != rank(out[k]) {
			return rank(out[i]) < rank(out[k])
		}
		return out[i].ReservedAt.After(out[k].ReservedAt)
	})
	return out[:n]
}

// inAttemptOrder sorts what the walk over the live attempts collected by
// attempt id, the order Decide's plan is given in.
func (plan *Plan) inAttemptOrder() {
	slices.SortFunc(plan.Release, func(a, b events.SlotReleased) int { return strings.Compare(a.Attempt, b.Attempt) })
	slices.SortFunc(plan.Teardown, func(a, b events.AttemptTeardownRequested) int { return strings.Compare(a.Attempt, b.Attempt) })
	slices.SortFunc(plan.Bound, func(a, b events.AttemptBound) int { return strings.Compare(a.Attempt, b.Attempt) })
	slices.SortFunc(plan.Place, func(a, b events.AttemptPlaced) int { return strings.Compare(a.Attempt, b.Attempt) })
	byID(plan.Deregister)
	byID(plan.Mint)
	byID(plan.Cleanup)
}

func byID(as []*events.Attempt) {
	slices.SortFunc(as, func(a, b *events.Attempt) int { return strings.Compare(a.ID, b.ID) })
}

func release(a *events.Attempt, reason string) events.SlotReleased {
	return events.SlotReleased{Pool: a.Pool, Host: a.Host, Attempt: a.ID, Reason: reason, JobID: a.JobID}
}

func teardown(a *events.Attempt, reason string) events.AttemptTeardownRequested {
	return events.AttemptTeardownRequested{
		AttemptRef: events.AttemptRef{Attempt: a.ID, Pool: a.Pool, Host: a.Host}, Reason: reason}
}
