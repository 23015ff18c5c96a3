package dispatch

import (
	"github.com/segmentio/encoding/json"

	"github.com/berth-ci/berth/events"
)

// workflowJobEvent is the part of GitHub's workflow_job webhook payload the
// intake stores (GitHub docs, "Webhook events and payloads":
// workflow_job; fields as go-github's WorkflowJobEvent names them). The
// rest of the payload (repository, organization, sender, installation:
// most of its bytes) is skipped unread: go-github's whole event, every
// field a pointer, cost the intake as much as storing the fact.
type workflowJobEvent struct {
	Action      string       `json:"action"`
	WorkflowJob *workflowJob `json:"workflow_job"`
	Repository  struct {
		Name  string `json:"name"`
		Owner struct {
			Login string `json:"login"`
		} `json:"owner"`
	} `json:"repository"`
}

// workflowJob is the payload's workflow_job object; runner_name,
// runner_id and conclusion are null until a runner takes the job and it
// ends.
type workflowJob struct {
	ID         int64    `json:"id"`
	RunID      int64    `json:"run_id"`
	RunAttempt int64    `json:"run_attempt"`
	Name       string   `json:"name"`
	Labels     []string `json:"labels"`
	RunnerName string   `json:"runner_name"`
	RunnerID   int64    `json:"runner_id"`
	Conclusion string   `json:"conclusion"`
}

// decodeWorkflowJob reads a workflow_job payload; an error is a payload
// whose fields do not have GitHub's types.
func decodeWorkflowJob(payload []byte) (*workflowJobEvent, error) {
	var e workflowJobEvent
	if err := json.Unmarshal(payload, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// jobID is the job's id, 0 without a workflow_job object.
func (e *workflowJobEvent) jobID() int64 {
	if e.WorkflowJob == nil {
		return 0
	}
	return e.WorkflowJob.ID
}

// labels is the job's runs-on labels, nil without a workflow_job object.
func (e *workflowJobEvent) labels() []string {
	if e.WorkflowJob == nil {
		return nil
	}
	return e.WorkflowJob.Labels
}

// jobFact is the fact a workflow_job delivery carries (nil for an action
// Berth does not track), under the delivery's id ("" for the job's own).
func jobFact(delivery string, e *workflowJobEvent, installation string) events.Payload {
	j := e.WorkflowJob
	ref := events.JobRef{
		Delivery: delivery, JobID: j.ID, RunID: j.RunID, RunAttempt: j.RunAttempt,
		Org: e.Repository.Owner.Login, Repo: e.Repository.Name, Name: j.Name,
		Labels: j.Labels, Installation: installation,
	}
	if ref.Labels == nil {
		ref.Labels = []string{}
	}
	switch e.Action {
	case "queued":
		return events.JobQueued{JobRef: ref}
	case "waiting":
		return events.JobWaiting{JobRef: ref}
	case "in_progress":
		return events.JobInProgress{JobRef: ref, RunnerName: j.RunnerName, RunnerID: j.RunnerID}
	case "completed":
		return events.JobCompleted{JobRef: ref, Conclusion: j.Conclusion, RunnerName: j.RunnerName, RunnerID: j.RunnerID}
	}
	return nil
}
