package setintake

import (
	"github.com/actions/scaleset"

	"github.com/berth-ci/berth/events"
)

// Facts turns one queue message into the job facts the webhook intake
// would have stored for the same jobs, and the runner request ids of its
// JobAvailable messages (to acquire). A job message without a runner
// request id, or a JobStarted without a runner name (GitHub sometimes
// sends them empty), yields no fact and counts in skipped: the REST
// reconcile poll finds what it would have said. Every fact names
// installation, the sets' GitHub installation ("": the default). It is
// pure.
func Facts(m *scaleset.RunnerScaleSetMessage, installation string) (facts []events.Payload, acquire []int64, skipped int) {
	for _, a := range m.JobAvailableMessages {
		if a.RunnerRequestID > 0 {
			acquire = append(acquire, a.RunnerRequestID)
		}
	}
	for _, a := range m.JobAssignedMessages {
		if ref, ok := refOf(a.JobMessageBase, installation); ok {
			facts = append(facts, events.JobQueued{JobRef: ref})
		} else {
			skipped++
		}
	}
	for _, s := range m.JobStartedMessages {
		if ref, ok := refOf(s.JobMessageBase, installation); ok && s.RunnerName != "" {
			facts = append(facts, events.JobInProgress{JobRef: ref, RunnerName: s.RunnerName, RunnerID: int64(s.RunnerID)})
		} else {
			skipped++
		}
	}
	for _, c := range m.JobCompletedMessages {
		if ref, ok := refOf(c.JobMessageBase, installation); ok {
			facts = append(facts, events.JobCompleted{JobRef: ref, Conclusion: Conclusion(c.Result),
				RunnerName: c.RunnerName, RunnerID: int64(c.RunnerID)})
		} else {
			skipped++
		}
	}
	return facts, acquire, skipped
}

// refOf is the job a message names. No delivery id: the fact's id is the
// job's own (job-<id>-queued, …), the one the reconcile poll writes too, so
// a message delivered twice, or a job found both ways, is stored once.
func refOf(b scaleset.JobMessageBase, installation string) (events.JobRef, bool) {
	labels := b.RequestLabels
	if labels == nil {
		labels = []string{}
	}
	return events.JobRef{JobID: b.RunnerRequestID, RunID: b.WorkflowRunID, Org: b.OwnerName, Repo: b.RepositoryName,
		Name: b.JobDisplayName, Labels: labels, Installation: installation}, b.RunnerRequestID > 0
}

// Conclusion maps a JobCompleted result to the REST API's conclusion
// ("succeeded" → "success", "failed" → "failure", "canceled" →
// "cancelled"); any other word passes through.
func Conclusion(result string) string {
	switch result {
	case "succeeded", "Succeeded":
		return "success"
	case "failed", "Failed":
		return "failure"
	case "canceled", "Canceled", "cancelled":
		return "cancelled"
	}
	return result
}
