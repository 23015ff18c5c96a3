package events

// Release reasons: why demand ended for a reservation.
const (
	ReleaseCompleted        = "completed"            // the job this attempt ran completed
	ReleaseSurplus          = "surplus"              // demand for the pool fell below its unbound runners (a job was cancelled before a runner took it)
	ReleaseProvisionTimeout = "provision_timeout"    // no runner came online before the provisioning deadline
	ReleaseRegistration     = "registration_timeout" // the runner started but never took a job
	ReleaseCreateFailed     = "create_failed"        // the backend's create step failed or was abandoned
	ReleaseMintFailed       = "mint_failed"          // GitHub refused the JIT config
	ReleaseRateLimited      = "rate_limited"         // GitHub rate-limited the JIT-config call: not a failure; the job stays demand and is booked again after the reset
	ReleaseGitHubRefused    = "github_refused"       // GitHub refused the App's own credentials (401, or 403 not for rate): culprit github; the job stays demand and calls pause with a back-off
	ReleaseHostLost         = "host_lost"            // the host stopped heartbeating
	ReleaseHostDraining     = "host_draining"        // the host drains: its bookings and idle runners go back
	ReleaseHostCordoned     = "host_cordoned"        // the host was cordoned before the booking got a VM
	ReleaseMaxDuration      = "max_duration"         // the job ran past its maximum duration
	ReleaseOperator         = "operator"             // an operator released it by hand (berth release)
	ReleaseWarmSurplus      = "warm_surplus"         // an idle warm VM above its pool's warm target (oldest first)
	ReleaseWarmRecycled     = "warm_recycled"        // an idle warm VM older than the maximum idle age
)

// StepDrain is the failed step of a placement an agent refused because its
// host is draining; the release that follows does not count as a failed
// attempt of the job (a drain never spends a job's attempts).
const StepDrain = "drain"

// SlotReserved books one slot of Pool on Host for a new attempt, before any
// runner registration exists (law 1). JobID is the job the attempt is minted
// for; GitHub may hand its runner any job of the pool's labels (law 8).
// Subject berth.evt.pool.<pool> (the pool's ledger, appended with
// Nats-Expected-Last-Subject-Sequence); emitted by the dispatcher; the
// dispatcher reacts by minting a JIT config. Key: attempt id + "reserved".
type SlotReserved struct {
	Pool    string   `json:"pool"`
	Host    string   `json:"host"`
	Attempt string   `json:"attempt"`
	JobID   int64    `json:"job_id"`
	N       int      `json:"n"`
	Labels  []string `json:"labels"`
	// Warm books a warm VM (JobID 0, Attempt a WarmAttemptID): it boots
	// without a JIT config and waits for a job to claim it (issue 8).
	Warm bool `json:"warm,omitempty"`
}

func (SlotReserved) EventType() string      { return TypeSlotReserved }
func (e SlotReserved) EventSubject() string { return PoolSubject(e.Pool) }
func (e SlotReserved) EventID() string      { return e.Attempt + "/reserved" }
func (e SlotReserved) Ledger() string       { return e.Pool }

// SlotReleased gives a reservation back, in the same reaction that sees
// demand end (law 2): never after, never waiting for teardown. Exactly one per
// reservation; the key does not include the reason, so two paths racing to
// release are deduplicated by the server. Emitted by the dispatcher
// (completion, surplus, mint failure) or the watchdog (deadlines, host lost).
type SlotReleased struct {
	Pool    string `json:"pool"`
	Host    string `json:"host"`
	Attempt string `json:"attempt"`
	Reason  string `json:"reason"`
	JobID   int64  `json:"job_id,omitempty"`
	// Culprit is who the release is charged to when it ends a failed
	// placement (culprit.go); "" means the reason's own (ReleaseCulprit).
	// Only CulpritJob spends one of the job's attempts.
	Culprit string `json:"culprit,omitempty"`
}

func (SlotReleased) EventType() string      { return TypeSlotReleased }
func (e SlotReleased) EventSubject() string { return PoolSubject(e.Pool) }
func (e SlotReleased) EventID() string      { return e.Attempt + "/released" }
func (e SlotReleased) Ledger() string       { return e.Pool }
