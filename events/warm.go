package events

import (
	"strconv"
	"time"
)

// Warm pools (issue 8): a VM waits before its job arrives, without ever
// breaking "book before you take" (law 1).
//
//   - SlotReserved with Warm set books a warm VM: it holds its pool's slot
//     and its host's physical capacity from the moment it is requested, in
//     the same ledgers as any attempt. Its id is WarmAttemptID; it has no job.
//   - AttemptPlaced with Warm set asks the host's agent to boot it without a
//     JIT config; AttemptReady says it booted and idles.
//   - When a job arrives, AttemptClaimed (on the pool's ledger, with its
//     expected sequence) binds one idle VM to the job before any runner
//     registration exists; the dispatcher then mints the JIT config and
//     hands it over with AttemptAssigned; the agent's backend assign step
//     starts the runner, and AttemptRunnerStarted follows as for any attempt.
//
// From the claim on, a warm attempt is an attempt like any other: one job,
// then teardown, under the same laws.

// WarmAttemptID is the id of the pool's n-th warm VM (also its VM and runner
// name). Pool names are subject tokens, so the id stays one.
func WarmAttemptID(pool string, n int) string {
	return "berth-warm-" + pool + "-" + strconv.Itoa(n)
}

// AttemptReady: a warm VM booted and waits for a job. Emitted by the agent
// when the backend's create step returns for a warm placement. Key: attempt
// + "ready".
type AttemptReady struct{ AttemptRef }

func (AttemptReady) EventType() string { return TypeAttemptReady }
func (e AttemptReady) EventID() string { return e.Attempt + "/ready" }

// AttemptClaimed binds a warm VM to the job it will serve, before any JIT
// config is minted for it. Subject: the pool's ledger, appended with its
// expected last sequence, so two dispatchers never claim one VM for two jobs
// nor over-book around it. Emitted by the dispatcher; key attempt + "claimed".
type AttemptClaimed struct {
	Pool    string `json:"pool"`
	Host    string `json:"host"`
	Attempt string `json:"attempt"`
	JobID   int64  `json:"job_id"`
}

func (AttemptClaimed) EventType() string      { return TypeAttemptClaimed }
func (e AttemptClaimed) EventSubject() string { return PoolSubject(e.Pool) }
func (e AttemptClaimed) EventID() string      { return e.Attempt + "/claimed" }
func (e AttemptClaimed) Ledger() string       { return e.Pool }

// AttemptAssigned hands a claimed warm VM its JIT config, sealed to the
// agent's curve key like a placement's. The agent reacts with the backend's
// assign step. Emitted by the dispatcher after minting; key attempt +
// "assigned".
type AttemptAssigned struct {
	AttemptRef
	JobID     int64  `json:"job_id"`
	RunnerID  int64  `json:"runner_id"`
	SealedJIT []byte `json:"sealed_jit"`
	SealedBy  string `json:"sealed_by"`
	SealedTo  string `json:"sealed_to"`
}

func (AttemptAssigned) EventType() string { return TypeAttemptAssigned }
func (e AttemptAssigned) EventID() string { return e.Attempt + "/assigned" }

// Idle reports a warm VM that booted and waits for a job.
func (a *Attempt) Idle() bool {
	return a.Warm && a.Ready && !a.Claimed && a.Held() && !a.TeardownReq && !a.Failed
}

// WarmFree reports a warm VM no job has claimed that still counts toward
// its pool's warm target: booting or idle, not failing or going away.
func (a *Attempt) WarmFree() bool {
	return a.Warm && !a.Claimed && a.Held() && !a.TeardownReq && !a.Failed && !a.Abandoned
}

// ProvisionClock is when the attempt's current wait for a runner began,
// and whether a provisioning deadline applies: from the booking for a cold
// attempt and a warm VM still booting; from the claim for a claimed warm VM;
// none for an idle warm VM (its maximum idle age recycles it instead).
func (a *Attempt) ProvisionClock() (time.Time, bool) {
	switch {
	case !a.Warm || !a.Ready:
		return a.ReservedAt, true
	case a.Claimed:
		return a.ClaimedAt, true
	}
	return time.Time{}, false
}
