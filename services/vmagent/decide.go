package vmagent

import (
	"time"

	"github.com/berth-ci/berth/events"
)

// Local is what one agent sees beyond the fold: the backend steps it has
// running, its drain, and the facts it appended that the fold has not
// shown yet. The shell gathers it each round; Decide only reads it.
type Local struct {
	Host string
	Now  time.Time
	// Draining refuses new creates (SIGTERM); ForceStop stops every live
	// VM (the drain's timeout ran out).
	Draining, ForceStop bool
	// HostLost: the host's own facts say it is lost while the agent runs;
	// Reannounced is when it last announced itself again.
	HostLost    bool
	Reannounced time.Time
	// Creating and Stopping hold the attempts whose create (or assign)
	// and stop steps are running.
	Creating, Stopping map[string]bool
	// RetryAt holds, per attempt whose stop failed or overran, the time
	// before which it is not tried again.
	RetryAt map[string]time.Time
	// InFlight reports whether the fact with this event id was appended
	// by this agent and has not come back through the fold.
	InFlight func(eventID string) bool
}

// ReannounceEvery is the least time between two announcements of a host
// that the log says is lost while its agent runs.
const ReannounceEvery = 5 * time.Second

// CreateCall runs the backend's create step for a placed attempt (after
// recording it provisioning, so a restart never creates it twice).
type CreateCall struct{ Attempt string }

// AssignCall hands a claimed warm VM its JIT config (the assign step).
type AssignCall struct{ Attempt string }

// StopCall runs the backend's stop step for an attempt's VM.
type StopCall struct{ Attempt string }

// AnnounceCall appends the host's online fact again.
type AnnounceCall struct{}

// CallKey implements events.Call.
func (c CreateCall) CallKey() string { return c.Attempt + "/create" }

// CallKey implements events.Call.
func (c AssignCall) CallKey() string { return c.Attempt + "/assign" }

// CallKey implements events.Call.
func (c StopCall) CallKey() string { return c.Attempt + "/stop" }

// CallKey implements events.Call.
func (AnnounceCall) CallKey() string { return "announce" }

// Decide derives the agent's next steps from the fold and what the agent
// sees: creates for new placements, assigns for claimed warm VMs, stops for
// teardown requests and abandoned VMs (each at most once at a time per
// attempt). An abandoned VM is stopped again with back-off until a stop
// returns: that late stop is what gives its physical capacity back. It is
// pure.
//
// What runs a job is stopped only by its job's end or an operator: a VM
// whose attempt's own facts bind it to a job that has not ended
// (Attempt.RunsJob) is kept whatever its create step reported (a create
// abandoned at its deadline whose runner took a job is adopted) and
// whatever teardown a deadline asked for, until the dispatcher records the
// job's end, a teardown for its completion comes, an operator asks
// (`berth release`), or the drain's timeout runs out.
func Decide(f *events.Fleet, l Local) events.Plan {
	var plan events.Plan
	// The fold's VM index, not the fold: the fold keeps stopped attempts for
	// the retention, and walking them every round was most of the CPU of a
	// long run (throughput fell from 233 to 73 jobs/s over 30,000 jobs).
	// Every case below needs a VM that is coming or not yet stopped.
	for at := range f.VMAttempts() {
		if at.Host == l.Host {
			plan.Add(l.attempt(at)...)
		}
	}
	if l.HostLost && !l.Draining && l.Now.Sub(l.Reannounced) > ReannounceEvery {
		plan.Add(events.Do(AnnounceCall{}))
	}
	return plan
}

// attempt decides what one of this host's attempts needs, if anything.
func (l Local) attempt(at *events.Attempt) []events.Step {
	ref := ref(at)
	busy := l.Creating[at.ID]
	switch {
	case at.Placed && !l.provisioned(at) && !at.TeardownReq && !busy && l.Draining:
		// Placed before the drain was seen: give the slot back without
		// spending one of the job's attempts.
		if !at.Failed {
			return []events.Step{events.Fact(events.AttemptFailed{AttemptRef: ref, Step: events.StepDrain, Error: "host draining"})}
		}
	case at.Placed && !l.provisioned(at) && !at.TeardownReq && !busy:
		return []events.Step{events.Do(CreateCall{at.ID})}
	case at.Warm && at.Assigned && at.Ready && !at.RunnerStarted && !at.Failed && !at.Abandoned && !at.TeardownReq &&
		!busy && !l.assignReported(ref):
		return []events.Step{events.Do(AssignCall{at.ID})}
	case (l.ForceStop || (l.Draining && at.Warm && !at.Assigned)) && at.VMLive() && !at.Stopped && !busy && !l.stopBusy(at):
		// A drain stops warm VMs no job was handed to at once: they have
		// no job to finish.
		return []events.Step{events.Do(StopCall{at.ID})}
	case at.RunsJob() && l.provisioned(at):
		// Its runner runs a job: adopted, left to run until the job ends.
	case (at.TeardownReq || at.Abandoned) && !at.Stopped && !busy && !l.stopBusy(at):
		if !l.provisioned(at) {
			// Nothing was created: the teardown is already done.
			return []events.Step{events.Fact(events.AttemptStopped{AttemptRef: ref})}
		}
		if next, ok := l.RetryAt[at.ID]; ok && l.Now.Before(next) {
			return nil
		}
		return []events.Step{events.Do(StopCall{at.ID})}
	}
	return nil
}

// provisioned reports whether the attempt's create was started: the fold
// shows its provisioning fact, or this agent appended it and the fold has
// not caught up yet. A create that returns before the fold catches up must
// neither be started again nor have its VM forgotten by a teardown.
func (l Local) provisioned(at *events.Attempt) bool {
	return at.Provisioning || l.inFlight(events.AttemptProvisioning{AttemptRef: ref(at)}.EventID())
}

// stopBusy: a stop step runs, or this agent appended the attempt's stop and
// waits for the fold to show it.
func (l Local) stopBusy(at *events.Attempt) bool {
	return l.Stopping[at.ID] || l.inFlight(events.AttemptStopped{AttemptRef: ref(at)}.EventID())
}

// assignReported: this agent appended the assign step's outcome and the
// fold has not caught up with it yet.
func (l Local) assignReported(r events.AttemptRef) bool {
	return l.inFlight(events.AttemptRunnerStarted{AttemptRef: r}.EventID()) ||
		l.inFlight(events.AttemptFailed{AttemptRef: r}.EventID()) ||
		l.inFlight(events.AttemptAbandoned{AttemptRef: r}.EventID())
}

func (l Local) inFlight(id string) bool { return l.InFlight != nil && l.InFlight(id) }

func ref(at *events.Attempt) events.AttemptRef {
	return events.AttemptRef{Attempt: at.ID, Pool: at.Pool, Host: at.Host}
}
