package events

import (
	"strconv"
	"time"
)

// AttemptRef names one placement: its id (also runner and VM name), pool and host.
type AttemptRef struct {
	Attempt string `json:"attempt"`
	Pool    string `json:"pool"`
	Host    string `json:"host"`
}

func (a AttemptRef) EventSubject() string { return AttemptSubject(a.Host, a.Attempt) }

// AttemptPlaced hands a booked attempt to its host's agent with a JIT config
// sealed to the agent's curve key (NATS xkeys), so no secret is in the log in
// clear. SealedBy is the dispatcher's curve public key. Emitted by the
// dispatcher after minting; the agent reacts by creating the VM. Key:
// attempt + "placed".
//
// A warm placement (Warm) has no job, runner or JIT config: those fields
// are then absent.
type AttemptPlaced struct {
	AttemptRef
	JobID     int64    `json:"job_id,omitempty"`
	Labels    []string `json:"labels"`
	RunnerID  int64    `json:"runner_id,omitempty"`
	SealedJIT []byte   `json:"sealed_jit,omitempty"`
	SealedBy  string   `json:"sealed_by,omitempty"`
	SealedTo  string   `json:"sealed_to,omitempty"`
	// Warm places a warm VM: no job, no JIT config; the agent boots it and
	// reports AttemptReady.
	Warm bool `json:"warm,omitempty"`
}

func (AttemptPlaced) EventType() string { return TypeAttemptPlaced }
func (e AttemptPlaced) EventID() string { return e.Attempt + "/placed" }

// AttemptProvisioning: the agent is about to call the backend's create step.
// From here the attempt's VM occupies the host's physical capacity until it
// is stopped. Key: attempt + "provisioning" (written before the call, so a
// restarted agent never creates twice).
type AttemptProvisioning struct{ AttemptRef }

func (AttemptProvisioning) EventType() string { return TypeAttemptProvisioning }
func (e AttemptProvisioning) EventID() string { return e.Attempt + "/provisioning" }

// AttemptRunnerStarted: the backend's create step returned and the runner was
// started with its JIT config. The provisioning deadline stops here.
type AttemptRunnerStarted struct {
	AttemptRef
	Took time.Duration `json:"took_ns"`
}

func (AttemptRunnerStarted) EventType() string { return TypeAttemptRunnerStarted }
func (e AttemptRunnerStarted) EventID() string { return e.Attempt + "/runner_started" }

// AttemptFailed: a lifecycle step failed (Step is "create", "open_jit"…).
// The dispatcher reacts by releasing the slot and requesting teardown.
// Culprit is who the agent charges it to (culprit.go): host for a create
// that failed, backend when the backend says the fault is its own, berth
// for a placement the agent could not open; "" reads as host.
type AttemptFailed struct {
	AttemptRef
	Step    string `json:"step"`
	Error   string `json:"error"`
	Culprit string `json:"culprit,omitempty"`
}

func (AttemptFailed) EventType() string { return TypeAttemptFailed }
func (e AttemptFailed) EventID() string { return e.Attempt + "/failed" }

// AttemptTeardownRequested asks the host's agent to stop and destroy the
// attempt's VM. It always follows the slot's release, never precedes it.
type AttemptTeardownRequested struct {
	AttemptRef
	Reason string `json:"reason"`
}

func (AttemptTeardownRequested) EventType() string { return TypeAttemptTeardownRequested }
func (e AttemptTeardownRequested) EventID() string { return e.Attempt + "/teardown_requested" }

// AttemptStopped: the attempt's VM is gone (the stop step returned, or there
// was nothing to stop). Late is true when the stop returned after the attempt
// had been abandoned; it discharges the abandoned VM from the host's physical
// ledger. Ended says how the stop step ended the VM, for a backend that
// escalates (vz: StopClean, StopForced or StopKilled); empty when the
// backend does not say, or nothing was running.
type AttemptStopped struct {
	AttemptRef
	Late  bool   `json:"late,omitempty"`
	Ended string `json:"ended,omitempty"`
}

// How a stop step ended its VM (AttemptStopped.Ended).
const (
	// StopClean: the guest shut down when asked (or was already off).
	StopClean = "clean"
	// StopForced: the guest ignored the request and was turned off.
	StopForced = "forced"
	// StopKilled: neither stop returned in time; the process holding the
	// guest was killed, which ended the guest and freed its place.
	StopKilled = "killed"
)

func (AttemptStopped) EventType() string { return TypeAttemptStopped }
func (e AttemptStopped) EventID() string { return e.Attempt + "/stopped" }

// AttemptAbandoned: a lifecycle step overran its deadline (law 3). The VM may
// still exist, so it keeps occupying the host's physical capacity until a
// late AttemptStopped. Emitted by the agent (step deadline) or the watchdog
// (teardown deadline).
type AttemptAbandoned struct {
	AttemptRef
	Step  string        `json:"step"`
	After time.Duration `json:"after_ns"`
}

func (AttemptAbandoned) EventType() string { return TypeAttemptAbandoned }
func (e AttemptAbandoned) EventID() string { return e.Attempt + "/abandoned" }

// AttemptDeregistered: the attempt's runner registration is gone from
// GitHub (the dispatcher deleted it, or GitHub answered 404). Only runners
// that never ran a job need it: GitHub removes an ephemeral runner after its
// job. Emitted by the dispatcher; key attempt + "deregistered".
type AttemptDeregistered struct {
	AttemptRef
	RunnerID int64 `json:"runner_id"`
}

func (AttemptDeregistered) EventType() string { return TypeAttemptDeregistered }
func (e AttemptDeregistered) EventID() string { return e.Attempt + "/deregistered" }

// AttemptBound records, on the attempt's own subject, that its runner took
// a job (law 8): GitHub named the attempt's runner in the job's in_progress
// or completed webhook. The agent consumes only its host's attempt
// subjects, never the job facts that bind runners, so this is how its fold
// learns that the VM runs a job and must not be stopped until that job
// ends or an operator asks. Ended records, in a second fact, that the job
// completed. Emitted by the dispatcher, derived each round from its fold
// (dispatch.Decide); read by the agent and the watchdog. Key: attempt +
// "/bound" (attempt + "/bound/ended" for the end).
type AttemptBound struct {
	AttemptRef
	JobID int64 `json:"job_id"`
	Ended bool  `json:"ended,omitempty"`
}

func (AttemptBound) EventType() string { return TypeAttemptBound }
func (e AttemptBound) EventID() string {
	if e.Ended {
		return e.Attempt + "/bound/ended"
	}
	return e.Attempt + "/bound"
}

// AttemptRunnerBusy: GitHub refused to delete the attempt's runner because
// it runs a job (422 on deregistration), at At, as the dispatcher that
// asked observed it. Every dispatcher replica and the watchdog leave the
// attempt alone until RunnerBusyFor (the watchdog FallbackFactor times
// that) after the newest such answer: a runner GitHub calls busy is never
// released or torn down on a deadline. Emitted by the dispatcher; key:
// attempt + "/runner_busy/" + At (every answer is a fact of its own).
type AttemptRunnerBusy struct {
	AttemptRef
	RunnerID int64     `json:"runner_id"`
	At       time.Time `json:"at"`
}

// RunnerBusyFor is how long a runner GitHub reported busy is left alone
// before a dispatcher asks again (its in_progress webhook normally arrives
// first).
const RunnerBusyFor = time.Minute

func (AttemptRunnerBusy) EventType() string { return TypeAttemptRunnerBusy }
func (e AttemptRunnerBusy) EventID() string {
	return e.Attempt + "/runner_busy/" + strconv.FormatInt(e.At.UnixNano(), 10)
}
