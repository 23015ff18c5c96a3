package events

import (
	"cmp"
	"slices"
	"strings"
	"time"
)

// Apply folds one event into the projection. It never fails and never
// panics: an event of an unknown type is counted in Skipped. Applying the
// same event twice, or a set of events in any order, gives the same state.
func (f *Fleet) Apply(e Event) {
	f.Applied++
	if e.Seq > f.LastSeq {
		f.LastSeq = e.Seq
	}
	if f.settledFact(e) {
		return // about a job or an attempt that is over: harmless (history.go)
	}
	switch d := e.Data.(type) {
	case *JobQueued:
		f.jobFact(d.JobRef, StatusQueued, e.Time, "", "")
	case *JobWaiting:
		f.jobFact(d.JobRef, StatusWaiting, e.Time, "", "")
	case *JobInProgress:
		f.jobFact(d.JobRef, StatusInProgress, e.Time, d.RunnerName, "")
	case *JobCompleted:
		f.jobFact(d.JobRef, StatusCompleted, e.Time, d.RunnerName, d.Conclusion)
	case *JobConflict:
		f.job(d.JobID).ConflictRecorded = true
	case *JobUnschedulable:
		j := f.job(d.JobID)
		j.Unschedulable, j.UnschedulableReason = true, d.Reason
	case *SlotReserved:
		f.poolSeq(d.Pool, e.Seq)
		a := f.attempt(d.Attempt, d.Pool, d.Host)
		f.touch(a, e.Time, func() {
			a.Reserved, a.ReservedAt = true, e.Time
			a.BookedSeq = max(a.BookedSeq, e.Seq)
			a.ReservedSeq = firstSeq(a.ReservedSeq, e.Seq)
			a.N, a.Labels, a.Warm = d.N, d.Labels, a.Warm || d.Warm
			if !d.Warm { // a warm VM's job comes from its claim
				a.JobID = d.JobID
			}
		})
		if d.Warm {
			if p := f.pool(d.Pool); d.N > p.WarmMinted {
				p.WarmMinted = d.N
			}
		} else if f.Settled(d.JobID) {
		} else if j := f.job(d.JobID); d.N > j.Minted {
			j.Minted = d.N
		}
	case *SlotReleased:
		f.poolSeq(d.Pool, e.Seq)
		a := f.attempt(d.Attempt, d.Pool, d.Host)
		f.touch(a, e.Time, func() {
			if a.releases == nil {
				a.releases = map[string]struct{}{}
			}
			a.releases[releaseKey(e, d.Reason)] = struct{}{}
			if !a.Released || e.Time.Before(a.ReleasedAt) {
				a.ReleaseReason, a.ReleasedAt = d.Reason, e.Time
				a.ReleaseCulprit = releaseCulprit(d.Reason, d.Culprit)
			}
			a.Released = true
			a.ReleasedSeq = firstSeq(a.ReleasedSeq, e.Seq)
			if a.JobID == 0 {
				a.JobID = d.JobID
			}
		})
		f.releaseHealth(d, e)
	case *AttemptPlaced:
		if !d.Warm {
			f.GitHub.Placed = maxMark(f.GitHub.Placed, markOf(e))
		}
		a := f.attempt(d.Attempt, d.Pool, d.Host)
		f.touch(a, e.Time, func() {
			a.Placed, a.PlacedAt, a.Warm = true, e.Time, a.Warm || d.Warm
			a.RunnerID, a.SealedJIT, a.SealedBy, a.SealedTo = d.RunnerID, d.SealedJIT, d.SealedBy, d.SealedTo
			if a.JobID == 0 {
				a.JobID = d.JobID
			}
			if a.Labels == nil {
				a.Labels = d.Labels
			}
		})
	case *AttemptProvisioning:
		f.attemptFlag(d.AttemptRef, e.Time, func(a *Attempt) { a.Provisioning, a.ProvisioningAt = true, e.Time })
	case *AttemptRunnerStarted:
		f.attemptFlag(d.AttemptRef, e.Time, func(a *Attempt) { a.RunnerStarted, a.RunnerStartedAt = true, e.Time })
		h := &f.host(d.Host).Health
		h.CreateOK = maxMark(h.CreateOK, markOf(e))
	case *AttemptFailed:
		f.attemptFlag(d.AttemptRef, e.Time, func(a *Attempt) {
			a.Failed, a.FailedAt, a.FailedStep, a.FailedError = true, e.Time, d.Step, d.Error
			a.FailedCulprit = AgentCulprit(d.Culprit) // the agent's word, held to its host (law 10)
		})
	case *AttemptTeardownRequested:
		f.attemptFlag(d.AttemptRef, e.Time, func(a *Attempt) {
			a.TeardownReq, a.TeardownAt, a.TeardownReason = true, e.Time, d.Reason
			if d.Reason == ReleaseCompleted || d.Reason == ReleaseMaxDuration {
				a.JobEnded = true
			}
			if authorToken(e.Subject) == RoleCLI {
				a.OperatorTeardown = true
			}
		})
	case *AttemptStopped:
		f.attemptFlag(d.AttemptRef, e.Time, func(a *Attempt) {
			a.Stopped, a.StoppedAt, a.StoppedLate, a.StopEnded = true, e.Time, d.Late, d.Ended
		})
	case *AttemptAbandoned:
		f.attemptFlag(d.AttemptRef, e.Time, func(a *Attempt) {
			a.Abandoned, a.AbandonedAt, a.AbandonedStep = true, e.Time, d.Step
		})
	case *AttemptDeregistered:
		f.attemptFlag(d.AttemptRef, e.Time, func(a *Attempt) { a.Deregistered = true })
	case *AttemptBound:
		f.attemptFlag(d.AttemptRef, e.Time, func(a *Attempt) {
			if a.BoundJobID == 0 {
				a.BoundJobID = d.JobID
			}
			a.JobEnded = a.JobEnded || d.Ended
		})
		f.imageRanJob(d.AttemptRef, e)
	case *AttemptRunnerVersion:
		f.runnerVersion(d, e)
	case *AttemptRunnerRefused:
		f.runnerRefused(d, e)
	case *AttemptRunnerBusy:
		f.attemptFlag(d.AttemptRef, e.Time, func(a *Attempt) {
			if d.At.After(a.RunnerBusyAt) {
				a.RunnerBusyAt = d.At
			}
		})
	case *AttemptReady:
		f.attemptFlag(d.AttemptRef, e.Time, func(a *Attempt) { a.Warm, a.Ready, a.ReadyAt = true, true, e.Time })
	case *AttemptClaimed:
		f.poolSeq(d.Pool, e.Seq)
		a := f.attempt(d.Attempt, d.Pool, d.Host)
		f.touch(a, e.Time, func() {
			a.Warm, a.Claimed, a.ClaimedAt = true, true, e.Time
			a.BookedSeq = max(a.BookedSeq, e.Seq)
			if a.JobID == 0 {
				a.JobID = d.JobID
			}
		})
	case *AttemptAssigned:
		f.GitHub.Placed = maxMark(f.GitHub.Placed, markOf(e))
		f.attemptFlag(d.AttemptRef, e.Time, func(a *Attempt) {
			a.Warm, a.Assigned, a.AssignedAt = true, true, e.Time
			a.RunnerID, a.SealedJIT, a.SealedBy, a.SealedTo = d.RunnerID, d.SealedJIT, d.SealedBy, d.SealedTo
			if a.JobID == 0 {
				a.JobID = d.JobID
			}
		})
	case *HostOnline:
		h := f.host(d.Host)
		if s := stampOf(e); s.after(h.online) {
			h.online, h.OnlineAt = s, e.Time
			h.Boot, h.ClaimCap, h.CurveKey, h.Backend, h.Assign = d.Boot, d.PhysicalCap, d.CurveKey, d.Backend, d.Assign
			h.Claim = map[string]PoolSlots{}
			for name, ps := range d.Pools {
				h.Claim[name] = PoolSlots{Labels: NormalizeLabels(ps.Labels), Slots: ps.Slots, Shape: ps.Shape.clone(), Installation: ps.Installation}
			}
			h.Resources = Resources{}
			if d.Resources != nil {
				h.Resources = *d.Resources
			}
			f.offer(h)
		}
		f.hostState(h, e, HostStateOnline)
	case *HostGranted:
		// The admin's word on what the host may offer (grant.go): the
		// newest grant stored wins, a revoke (no pools) included.
		h := f.host(d.Host)
		if s := stampOf(e); s.after(h.grant) {
			g := GrantFor(d.Host, nil, d.PhysicalCap, d.By, d.At)
			for name, p := range d.Pools {
				g.Pools[name] = PoolGrant{Labels: NormalizeLabels(p.Labels), Slots: p.Slots, Installation: p.Installation}
			}
			h.grant, h.Grant = s, &g
			f.offer(h)
		}
	case *HostDraining:
		h := f.host(d.Host)
		if f.hostState(h, e, HostStateDraining) {
			h.DrainedBy, h.DrainReason = AuthorOf(e.Subject), d.Reason
		}
	case *HostLost:
		f.hostState(f.host(d.Host), e, HostStateLost)
	case *HostCordoned:
		f.cordon(d.HostChange, e, true)
	case *HostUncordoned:
		f.cordon(d.HostChange, e, false)
		// An operator's uncordon also ends an operator's drain: the way
		// back from `berth drain` (an agent's own drain ends when it
		// restarts and announces itself again).
		if h := f.host(d.Host); AuthorOf(e.Subject) == RoleCLI && h.State == HostStateDraining && h.DrainedBy == RoleCLI {
			f.hostState(h, e, HostStateOnline)
		}
	case *HostDegraded:
		f.degraded(d.HostChange, e, d.Culprit)
	case *HostRecovered:
		f.degraded(d.HostChange, e, "")
	case *DemandWaiting:
		if d.At.After(f.DemandReported[d.Pool]) {
			f.DemandReported[d.Pool] = d.At
		}
	case *AlarmRaised:
		a := f.alarm(d.Key)
		if s := stampOf(e); s.after(a.last) {
			a.last, a.Active = s, true
			a.Kind, a.Pool, a.Message, a.RaisedAt = d.Kind, d.Pool, d.Message, d.At
		}
	case *AlarmCleared:
		a := f.alarm(d.Key)
		if s := stampOf(e); s.after(a.last) {
			a.last, a.Active, a.Pool = s, false, d.Pool
		}
	default:
		f.Skipped++
	}
}

// Skip records a stored message that could not be decoded (malformed, or of
// a type this build does not know): it is counted and passed over, never
// fatal, and the fold still covers its sequence.
//
// subject is the NATS subject it was stored on: a message skipped on a
// pool's ledger still moves that ledger's last sequence, or every later
// booking there would fail its expected-sequence check forever.
func (f *Fleet) Skip(seq uint64, subject string) {
	f.Skipped++
	if seq > f.LastSeq {
		f.LastSeq = seq
	}
	// A pool's ledger is berth.evt.pool.<pool>.<role> (or, written before
	// roles were in subjects, berth.evt.pool.<pool>).
	if rest, ok := strings.CutPrefix(subject, SubjectPrefix+".pool."); ok {
		if pool, _, _ := strings.Cut(rest, "."); pool != "" {
			f.poolSeq(pool, seq)
		}
	}
}

func (f *Fleet) jobFact(r JobRef, st JobStatus, at time.Time, runner, conclusion string) {
	if r.Delivery != "" && !f.history.noDeliveries {
		if seen, ok := f.Deliveries[r.Delivery]; (!ok && !f.DeliveryStored(r.Delivery)) || (ok && at.Before(seen)) {
			f.Deliveries[r.Delivery] = at
		}
	}
	f.sawRepo(r.Installation, r.Org, r.Repo, at)
	if f.Settled(r.JobID) {
		return // a redelivery of a job that is over
	}
	j := f.job(r.JobID)
	if j.RunID == 0 {
		j.RunID, j.RunAttempt, j.Org, j.Repo, j.Name = r.RunID, r.RunAttempt, r.Org, r.Repo, r.Name
	}
	if j.Installation == "" {
		j.Installation = r.Installation
	}
	if j.Labels == nil && r.Labels != nil {
		j.Labels = NormalizeLabels(r.Labels)
		j.labelKey = strings.Join(j.Labels, ",")
	}
	if st > j.Status {
		j.Status = st
	}
	switch st {
	case StatusQueued:
		if j.QueuedAt.IsZero() || at.Before(j.QueuedAt) {
			j.QueuedAt = at
		}
	case StatusInProgress:
		if j.StartedAt.IsZero() || at.Before(j.StartedAt) {
			j.StartedAt = at
		}
	case StatusCompleted:
		if j.CompletedAt.IsZero() || at.Before(j.CompletedAt) {
			j.CompletedAt, j.Conclusion = at, conclusion
		}
	}
	if runner != "" && j.Runner == "" {
		j.Runner = runner
		if owner, taken := f.byRunner[runner]; !taken {
			f.byRunner[runner] = j.ID
			f.markAttempt(runner) // bound now: no registration left to clean up
		} else if owner != j.ID {
			j.Conflict = runner // the first binding stands (BL-17)
		}
	} else if runner != "" && runner != j.Runner && j.AlsoOn == "" {
		// The job reported in progress on a second runner: GitHub says
		// both run it, so a free runner is bound to it too and neither is
		// torn down before it completes (issue 17); one bound to another
		// job keeps that job. Either way the conflict is recorded.
		if _, taken := f.byRunner[runner]; !taken {
			f.byRunner[runner] = j.ID
			f.markAttempt(runner)
		}
		j.AlsoOn = runner
	}
}

// authorToken is the role token a multi-author subject ends in ("" for
// others and for facts folded by hand without a subject).
func authorToken(subject string) Role {
	if i := strings.LastIndexByte(subject, '.'); i > 0 && multiAuthor(subject[:i]) {
		return Role(subject[i+1:])
	}
	return ""
}

func (f *Fleet) poolSeq(pool string, seq uint64) {
	if p := f.pool(pool); seq > p.LastSeq {
		p.LastSeq = seq
	}
}

func (f *Fleet) attemptFlag(r AttemptRef, at time.Time, set func(*Attempt)) {
	a := f.attempt(r.Attempt, r.Pool, r.Host)
	f.touch(a, at, func() { set(a) })
}

// hostState sets h's state from e unless a later fact set it; it reports
// whether it did.
func (f *Fleet) hostState(h *Host, e Event, st HostState) bool {
	if s := stampOf(e); s.after(h.state) {
		h.state, h.State, h.StateAt = s, st, e.Time
		return true
	}
	return false
}

func (f *Fleet) cordon(c HostChange, e Event, on bool) {
	h := f.host(c.Host)
	if s := stampOf(e); s.after(h.cordon) {
		h.cordon, h.Cordoned = s, on
		h.CordonReason, h.CordonBy, h.CordonedAt = "", "", time.Time{}
		if on {
			h.CordonReason, h.CordonBy, h.CordonedAt = c.Reason, c.By, e.Time
			if AuthorOf(e.Subject) != RoleWatchdog && c.By == string(RoleWatchdog) {
				// Only the watchdog's own subject says the watchdog set it
				// (law 10): it lifts only what it set, never an operator's.
				h.CordonBy = string(RoleCLI) + " (claimed watchdog)"
			}
		}
	}
}

// releaseHealth records on the host's health what a release says about
// it: a placement failure charged to the host, its image or its backend
// (a lost host is its own state, not a placement failure), or a runner
// that ran its job to the end.
func (f *Fleet) releaseHealth(d *SlotReleased, e Event) {
	if d.Host == "" {
		return
	}
	culprit := releaseCulprit(d.Reason, d.Culprit)
	if d.Reason == ReleaseGitHubRefused {
		f.GitHub.Refused = maxMark(f.GitHub.Refused, markOf(e))
	}
	switch {
	case d.Reason == ReleaseCompleted:
		h := &f.host(d.Host).Health
		h.RunnerOK = maxMark(h.RunnerOK, markOf(e))
	case (HostFault(culprit) || culprit == CulpritBerth) && d.Reason != ReleaseHostLost && d.Reason != ReleaseRunnerRefused:
		// (A refused runner is its image's, kept on Host.Images: the
		// host serves its other images.)
		// A placement the host's agent could not open (Berth's own setup:
		// the dispatcher's sealing key is not trusted) counts too: the host
		// cannot serve until it is fixed, so placements back off it with
		// one probe at a time and its degradation alarm says why, instead
		// of re-booking at once and flooding GitHub with registrations.
		f.host(d.Host).Health.failed(HostFailure{Attempt: d.Attempt, Culprit: culprit, Reason: d.Reason, At: markOf(e)})
	}
}

// degraded folds a HostDegraded (culprit set) or a HostRecovered (culprit
// ""): the fact stored last wins.
func (f *Fleet) degraded(c HostChange, e Event, culprit string) {
	h := &f.host(c.Host).Health
	if m := markOf(e); m.After(h.Changed) {
		h.Changed, h.Degraded = m, culprit != ""
		h.Culprit, h.Reason, h.Since = "", "", Mark{}
		if culprit != "" {
			h.Culprit, h.Reason, h.Since = culprit, c.Reason, m
		}
	}
}

func (f *Fleet) alarm(key string) *Alarm {
	a, ok := f.Alarms[key]
	if !ok {
		a = &Alarm{Key: key}
		f.Alarms[key] = a
	}
	return a
}

// DeliveryMemory is how long Compact keeps a delivery id at least: GitHub
// redelivers a failed delivery for 3 days, plus an hour of clock slack.
const DeliveryMemory = 73 * time.Hour

// Compact drops terminal records older than retention (law 5: memory is flat
// in the number of jobs served), after leaving, from DefaultSettleAfter on,
// only the ids of what is over (CompactAfter). Keep retention above
// GitHub's 3-day redelivery window in production, so a late redelivery
// still finds the job it would otherwise resurrect.
func (f *Fleet) Compact(now time.Time, retention time.Duration) (jobs, attempts int) {
	return f.CompactAfter(now, DefaultSettleAfter, retention)
}

// CompactAfter is Compact with the settling time given. A completed job is
// dropped once none of its attempts is live; a terminal attempt once its
// last fact is retention old. Before that, once its last fact is settle
// old (or retention, if shorter), a job or an attempt that is over and
// that nothing can act on any more leaves only its id and when it ended
// (history.go, issue 19): a few bytes instead of a record, enough to make
// a redelivered webhook or a late fact about it harmless; the id is
// dropped at the retention. Of those over but not yet settle old, only the
// newest KeepOver keep their records (settling).
func (f *Fleet) CompactAfter(now time.Time, settle, retention time.Duration) (jobs, attempts int) {
	return f.compact(now, settling{after: settle, keep: KeepOver}, retention)
}

// settling is when Compact leaves only the id of what is over: after
// `after`, or at once for all but the newest `keep` (jobs and attempts
// counted apart).
type settling struct {
	after time.Duration
	keep  int
}

func (f *Fleet) compact(now time.Time, s settling, retention time.Duration) (jobs, attempts int) {
	cut := now.Add(-retention)
	scut := now.Add(-min(s.after, retention))
	ecut := now // beyond the newest keep, what is over settles at once
	pk := &f.history.peaks
	pk.jobs, pk.attempts = max(pk.jobs, len(f.Jobs)), max(pk.attempts, len(f.Attempts))
	pk.byRunner, pk.deliveries = max(pk.byRunner, len(f.byRunner)), max(pk.deliveries, len(f.Deliveries))
	defer func() {
		jobs, attempts := pk.jobs, pk.attempts
		f.Jobs, f.Attempts = shrunk(f.Jobs, &pk.jobs), shrunk(f.Attempts, &pk.attempts)
		f.byRunner, f.Deliveries = shrunk(f.byRunner, &pk.byRunner), shrunk(f.Deliveries, &pk.deliveries)
		if pk.jobs < jobs || pk.attempts < attempts {
			// The live index holds a subset of the records, in maps that
			// keep the buckets of their peak too: it is built again at
			// its new size on the next read.
			f.live = live{}
		}
		f.history.left = len(f.Jobs) + len(f.Attempts)
	}()
	attempts = f.compactAttempts(cut, scut, ecut, s.keep)
	jobs = f.compactJobs(cut, scut, ecut, s.keep)
	f.dropOld(now, cut, ecut, retention)
	return jobs, attempts
}

// compactAttempts settles the attempts over since scut, and those over
// since ecut beyond the newest keep of them; it drops terminal ones whose
// last fact is older than cut. It returns how many records left the fold.
func (f *Fleet) compactAttempts(cut, scut, ecut time.Time, keep int) (n int) {
	var settled, early []*Attempt
	for id, a := range f.Attempts {
		switch {
		case f.settleAttempt(a, scut):
			settled = append(settled, a)
		case a.Terminal() && a.LastAt.Before(cut):
			delete(f.Attempts, id)
			f.markAttempt(id)
			n++
		case f.settleAttempt(a, ecut):
			early = append(early, a)
		}
	}
	settled = append(settled, oldestBeyond(early, keep, func(a, b *Attempt) int {
		return cmp.Or(a.LastAt.Compare(b.LastAt), strings.Compare(a.ID, b.ID))
	})...)
	var tombs []tomb[string]
	var packedIDs []stamped[uint64]
	for _, a := range settled {
		if k, ok := packAttempt(a.ID); ok {
			packedIDs = append(packedIDs, stamped[uint64]{k, a.LastAt.Unix()})
		} else {
			tombs = append(tombs, tomb[string]{a.ID, a.LastAt.Unix()})
		}
		delete(f.Attempts, a.ID)
		f.markAttempt(a.ID)
		n++
	}
	f.history.attempts.add(tombs)
	f.history.placements.add(packedIDs)
	return n
}

// compactJobs settles the completed jobs over since scut, and those over
// since ecut beyond the newest keep of them, once no record of their
// attempts is left; it drops what the retention no longer keeps. It
// returns how many records left the fold.
func (f *Fleet) compactJobs(cut, scut, ecut time.Time, keep int) (n int) {
	// A job stays while an attempt booked for it, or whose runner took it,
	// is live: its binding is how that attempt is accounted for (law 6, 8).
	// It settles only once no record of those attempts is left.
	busy, kept := map[int64]bool{}, map[int64]bool{}
	for _, a := range f.Attempts {
		if !a.Terminal() {
			busy[a.JobID], busy[f.byRunner[a.ID]] = true, true
		}
		kept[a.JobID], kept[f.byRunner[a.ID]] = true, true
	}
	var settled, early []*Job
	for id, j := range f.Jobs {
		if busy[id] {
			continue
		}
		done := j.Status == StatusCompleted && j.CompletedAt.Before(cut)
		// A job only attempts mention (no webhook ever came) is kept while
		// they are live, and dropped with them.
		orphan := j.Status == StatusUnknown
		switch {
		case f.settleJob(j, scut) && !kept[id]:
			settled = append(settled, j)
		case done || orphan || (j.Unschedulable && j.QueuedAt.Before(cut)):
			f.dropJob(j)
			n++
		case f.settleJob(j, ecut):
			early = append(early, j) // ranked with the rest, even while an attempt's record keeps it
		}
	}
	for _, j := range oldestBeyond(early, keep, func(a, b *Job) int {
		return cmp.Or(a.CompletedAt.Compare(b.CompletedAt), cmp.Compare(a.ID, b.ID))
	}) {
		if !kept[j.ID] {
			settled = append(settled, j)
		}
	}
	tombs := make([]stamped[uint64], 0, len(settled))
	for _, j := range settled {
		f.dropJob(j)
		tombs = append(tombs, stamped[uint64]{jobKey(j.ID), j.CompletedAt.Unix()})
		n++
	}
	f.history.jobs.add(tombs)
	return n
}

// dropJob takes a job's record, and its runners' bindings to it, out of
// the fold.
func (f *Fleet) dropJob(j *Job) {
	for _, r := range []string{j.Runner, j.AlsoOn} {
		if r != "" && f.byRunner[r] == j.ID {
			delete(f.byRunner, r)
			f.markAttempt(r)
		}
	}
	f.uncount(j)
	delete(f.Jobs, j.ID)
	f.markJob(j.ID)
}

// oldestBeyond returns all but the newest keep of recs, ordered by older
// (when each ended, then its id, so every fold picks the same).
func oldestBeyond[R any](recs []R, keep int, older func(a, b R) int) []R {
	if len(recs) <= keep {
		return nil
	}
	slices.SortFunc(recs, older)
	return recs[:len(recs)-keep]
}

// dropOld drops what the retention no longer keeps: settled ids, polled
// repositories and cleared alarms older than cut, delivery ids older than
// the delivery memory; and settles the delivery ids older than scut (a
// delivery id's record shows nothing an operator reads: it settles early).
func (f *Fleet) dropOld(now, cut, scut time.Time, retention time.Duration) {
	f.history.jobs.dropBefore(cut.Unix())
	f.history.attempts.dropBefore(cut.Unix())
	f.history.placements.dropBefore(cut.Unix())
	for k, at := range f.history.repos {
		if at < cut.Unix() {
			delete(f.history.repos, k)
		}
	}
	for k, a := range f.Alarms {
		if !a.Active && a.last.at.Before(cut) {
			delete(f.Alarms, k)
		}
	}
	dcut := now.Add(-max(retention, DeliveryMemory))
	for id, at := range f.Deliveries {
		if at.Before(dcut) {
			delete(f.Deliveries, id)
		}
	}
	f.settleDeliveries(scut, dcut.Unix())
}

// firstSeq is the earlier of a recorded sequence (0: none yet) and seq:
// the same whatever order a replay applies facts in.
func firstSeq(recorded, seq uint64) uint64 {
	if recorded == 0 || (seq != 0 && seq < recorded) {
		return seq
	}
	return recorded
}
