package events

import (
	"iter"
	"maps"
)

// live indexes the records a decider may still act on, so that the
// dispatcher's and the watchdog's every round walks the live fleet, not the
// history the fold keeps for the retention (72 h by default: at 2,000 jobs a
// minute that is millions of terminal records). It is built from a full scan
// on first use and kept by Apply and Compact from then on: each marks the
// records it touched, and the next read re-judges just those. A fold no
// decider reads (an agent's, the CLI's) never builds it and pays nothing.
type live struct {
	built         bool
	jobs          map[int64]*Job
	attempts      map[string]*Attempt
	vms           map[string]*Attempt // the attempts whose VM is Berth's to act on (a subset)
	unquiet       map[string]*Attempt // the live attempts less the quiet ones (a subset)
	dirtyJobs     map[int64]struct{}
	dirtyAttempts map[string]struct{}
}

// open reports whether a decider may still act on the job: it is demand,
// or GitHub reported it on a runner bound to another job and no fact has
// recorded that yet (BL-17).
func (j *Job) open() bool {
	return j.Demand() || j.conflictToRecord()
}

// conflictToRecord: GitHub reported the job on a runner bound to another
// job, or on a second runner, and no fact has recorded it yet.
func (j *Job) conflictToRecord() bool {
	return !j.ConflictRecorded && ((j.Conflict != "" && j.Status == StatusInProgress) || j.AlsoOn != "")
}

// ConflictToRecord reports whether a JobConflict fact is due for the job.
func (j *Job) ConflictToRecord() bool { return j.conflictToRecord() }

// actionable reports whether a decider may still act on the attempt: it
// holds a slot or a VM; or its teardown was asked for and no stop is
// recorded (an agent answers one for a booking that never got a VM); or it
// is done but its runner registration, never used by a job, is still to
// be deleted.
func (f *Fleet) actionable(a *Attempt) bool {
	return vmPending(a) || (a.RunnerID != 0 && !a.Deregistered && f.byRunner[a.ID] == 0)
}

// quiet reports whether a live attempt needs nothing from the dispatcher
// while it stays as it is: it holds its slot for a job its runner took,
// that job has not completed, and its host is not draining it. Most of a
// busy fleet is quiet (10,000 running jobs made the dispatcher's every
// round walk 10,000 attempts, half the CPU of a probe under that load).
func (f *Fleet) quiet(a *Attempt) bool {
	if !a.Held() || (a.Failed && a.FailedStep == StepDrain) || (a.Warm && !a.Placed) {
		return false
	}
	bound := f.byRunner[a.ID]
	j := f.Jobs[bound]
	// Until the dispatcher has recorded the binding on the attempt's own
	// subject (AttemptBound), it has something to do.
	return bound != 0 && j != nil && j.Status != StatusCompleted && a.BoundJobID != 0
}

// vmPending reports whether something may still happen to the attempt's VM:
// it is not Terminal, or its teardown was asked for and no stop is
// recorded.
func vmPending(a *Attempt) bool { return !a.Terminal() || (a.TeardownReq && !a.Stopped) }

// OpenJobs yields, in no order, every job a decider may act on: demand, or
// a conflict not yet recorded. The jobs must not be modified.
func (f *Fleet) OpenJobs() iter.Seq[*Job] {
	f.settle()
	return maps.Values(f.live.jobs)
}

// LiveAttempts yields, in no order, every attempt a decider may act on:
// not Terminal, or terminal with a registration no job used that is not yet
// deleted. The attempts must not be modified.
func (f *Fleet) LiveAttempts() iter.Seq[*Attempt] {
	f.settle()
	return maps.Values(f.live.attempts)
}

// UnquietAttempts yields, in no order, the live attempts that are not
// quiet: what the dispatcher acts on. A quiet attempt becomes unquiet when
// its own facts, its binding or its job's status change, each of which
// marks it. The attempts must not be modified.
func (f *Fleet) UnquietAttempts() iter.Seq[*Attempt] {
	f.settle()
	return maps.Values(f.live.unquiet)
}

// VMAttempts yields, in no order, the live attempts whose VM something may
// still happen to: what an agent acts on. It leaves out attempts live only
// for a runner registration to delete: an agent's fold never sees the job
// facts that bind runners, so there every attempt that ran a job would
// look like one for the retention. The attempts must not be modified.
func (f *Fleet) VMAttempts() iter.Seq[*Attempt] {
	f.settle()
	return maps.Values(f.live.vms)
}

// LiveCounts is the size of the index, for metrics and benchmarks.
func (f *Fleet) LiveCounts() (jobs, attempts int) {
	f.settle()
	return len(f.live.jobs), len(f.live.attempts)
}

func (f *Fleet) markJob(id int64) {
	if f.live.built {
		f.live.dirtyJobs[id] = struct{}{}
	}
}

func (f *Fleet) markAttempt(id string) {
	if f.live.built {
		f.live.dirtyAttempts[id] = struct{}{}
	}
}

// settle builds the index, or re-judges the records marked since the last
// read.
func (f *Fleet) settle() {
	l := &f.live
	if !l.built {
		*l = live{built: true, jobs: map[int64]*Job{}, attempts: map[string]*Attempt{}, vms: map[string]*Attempt{}, unquiet: map[string]*Attempt{},
			dirtyJobs: map[int64]struct{}{}, dirtyAttempts: map[string]struct{}{}}
		for id, j := range f.Jobs {
			if j.open() {
				l.jobs[id] = j
			}
		}
		for id, a := range f.Attempts {
			if f.actionable(a) {
				l.attempts[id] = a
				if !f.quiet(a) {
					l.unquiet[id] = a
				}
			}
			if vmPending(a) {
				l.vms[id] = a
			}
		}
		return
	}
	for id := range l.dirtyJobs {
		if j := f.Jobs[id]; j != nil && j.open() {
			l.jobs[id] = j
		} else {
			delete(l.jobs, id)
		}
	}
	clear(l.dirtyJobs)
	for id := range l.dirtyAttempts {
		a := f.Attempts[id]
		if a != nil && f.actionable(a) {
			l.attempts[id] = a
		} else {
			delete(l.attempts, id)
		}
		if a != nil && f.actionable(a) && !f.quiet(a) {
			l.unquiet[id] = a
		} else {
			delete(l.unquiet, id)
		}
		if a != nil && vmPending(a) {
			l.vms[id] = a
		} else {
			delete(l.vms, id)
		}
	}
	clear(l.dirtyAttempts)
}
