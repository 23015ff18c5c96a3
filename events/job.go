package events

import (
	"strconv"
	"time"
)

// JobRef identifies a GitHub Actions job as a workflow_job webhook describes it.
// Delivery is the X-GitHub-Delivery header of the webhook the fact came from;
// a redelivery (same delivery id, possibly days later) is the same fact.
type JobRef struct {
	Delivery   string   `json:"delivery"`
	JobID      int64    `json:"job_id"`
	RunID      int64    `json:"run_id"`
	RunAttempt int64    `json:"run_attempt,omitempty"`
	Org        string   `json:"org,omitempty"`
	Repo       string   `json:"repo,omitempty"`
	Name       string   `json:"name,omitempty"`
	Labels     []string `json:"labels"`
	// Installation names the GitHub installation (dispatcher.github's
	// entry) the job came from; empty: the only, unnamed one. Only that
	// installation's pools serve the job (PoolSlots.Installation).
	Installation string `json:"installation,omitempty"`
}

func (r JobRef) EventSubject() string { return JobSubject(r.JobID) }
func (r JobRef) id(kind string) string {
	if r.Delivery != "" {
		return "gh-" + r.Delivery
	}
	return "job-" + strconv.FormatInt(r.JobID, 10) + "-" + kind
}

// JobQueued: GitHub queued a job (workflow_job action "queued").
// Subject berth.evt.job.<id>; emitted by the dispatcher's webhook intake (and
// later its reconcile poll); the dispatcher reacts by booking a slot.
// Idempotency key: the delivery id.
type JobQueued struct{ JobRef }

func (JobQueued) EventType() string { return TypeJobQueued }
func (e JobQueued) EventID() string { return e.id("queued") }

// JobWaiting: the job waits for an environment approval (action "waiting").
// It is not demand until it is queued. Same subject, emitter and key as JobQueued.
type JobWaiting struct{ JobRef }

func (JobWaiting) EventType() string { return TypeJobWaiting }
func (e JobWaiting) EventID() string { return e.id("waiting") }

// JobInProgress: a runner took the job (action "in_progress"). RunnerName is
// the only reliable binding of a runner (and so an attempt) to a job: GitHub
// hands a JIT runner any queued job whose labels it has.
type JobInProgress struct {
	JobRef
	RunnerName string `json:"runner_name"`
	RunnerID   int64  `json:"runner_id,omitempty"`
}

func (JobInProgress) EventType() string { return TypeJobInProgress }
func (e JobInProgress) EventID() string { return e.id("in_progress") }

// JobCompleted: the job finished (action "completed"), with conclusion
// success, failure, cancelled, skipped… RunnerName is empty when the job was
// cancelled before any runner took it. The dispatcher reacts by releasing the
// slot of the attempt named by RunnerName, in the same reaction (law 2).
type JobCompleted struct {
	JobRef
	Conclusion string `json:"conclusion"`
	RunnerName string `json:"runner_name,omitempty"`
	RunnerID   int64  `json:"runner_id,omitempty"`
}

func (JobCompleted) EventType() string { return TypeJobCompleted }
func (e JobCompleted) EventID() string { return e.id("completed") }

// JobUnschedulable: Berth gave up placing a job after Attempts failed
// placements. Emitted by the dispatcher; key job id.
type JobUnschedulable struct {
	JobID    int64  `json:"job_id"`
	Reason   string `json:"reason"`
	Attempts int    `json:"attempts"`
}

func (JobUnschedulable) EventType() string      { return TypeJobUnschedulable }
func (e JobUnschedulable) EventSubject() string { return JobSubject(e.JobID) }
func (e JobUnschedulable) EventID() string {
	return "job-" + strconv.FormatInt(e.JobID, 10) + "-unschedulable"
}

// JobConflict: GitHub reported the job in progress on a runner that is
// bound to another job. An ephemeral runner runs one job, yet GitHub has
// been seen handing a busy runner a second one (actions/runner #4670,
// scenario BL-17), so the binding is rejected: the runner's VM stays bound
// to its first job and is stopped only when that job completes, and this
// job stays demand until it completes, so it is booked a VM of its own.
// Emitted by the dispatcher once its fold sees the conflict. Subject: the
// job's; key: job id + "conflict".
type JobConflict struct {
	JobID    int64  `json:"job_id"`
	Runner   string `json:"runner_name"`
	BoundJob int64  `json:"bound_job_id"`
}

func (JobConflict) EventType() string      { return TypeJobConflict }
func (e JobConflict) EventSubject() string { return JobSubject(e.JobID) }
func (e JobConflict) EventID() string {
	return "job-" + strconv.FormatInt(e.JobID, 10) + "-conflict"
}

// DemandWaiting: queued jobs of a pool have waited for a slot for at least
// Waited. Emitted by the watchdog after 30 s and every 5 min after (law 6).
// Subject berth.evt.demand.<pool>; key pool + report time.
type DemandWaiting struct {
	Pool        string        `json:"pool"`
	Jobs        int           `json:"jobs"`
	OldestJobID int64         `json:"oldest_job_id"`
	Waited      time.Duration `json:"waited_ns"`
	Reason      string        `json:"reason"`
	At          time.Time     `json:"at"`
}

func (DemandWaiting) EventType() string      { return TypeDemandWaiting }
func (e DemandWaiting) EventSubject() string { return DemandSubject(e.Pool) }
func (e DemandWaiting) EventID() string {
	return "demand-" + e.Pool + "-" + strconv.FormatInt(e.At.Unix(), 10)
}
