package dispatch

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/berth-ci/berth/events"
)

// JobState is what the REST API says of one job (GET
// /repos/{owner}/{repo}/actions/jobs/{job_id}).
type JobState struct {
	Status     string // queued, in_progress, completed, waiting…
	Conclusion string
	RunnerName string
	RunnerID   int64
}

// Reconcile tunes the poll that catches webhooks GitHub never delivered
// (GitHub does not retry a failed delivery by itself).
type Reconcile struct {
	// After: a job whose last fact is older than this is asked about.
	After time.Duration
	// Every: how often a round runs. Limit: jobs asked per round, so the
	// poll costs a bounded share of the API budget.
	Every time.Duration
	Limit int
}

// ReconcileCandidates picks the jobs to ask GitHub about: queued or in
// progress, with a runner of ours or a pool's demand at stake, and no fact
// for longer than After; oldest first, at most Limit. It is pure.
func ReconcileCandidates(f *events.Fleet, now time.Time, r Reconcile) []*events.Job {
	var out []*events.Job
	for _, j := range f.Jobs {
		if j.Status != events.StatusQueued && j.Status != events.StatusInProgress {
			continue
		}
		if j.Org == "" || j.Repo == "" || now.Sub(lastFact(j)) < r.After {
			continue
		}
		if j.Status == events.StatusInProgress && f.Attempts[j.Runner] == nil {
			continue // not run by a runner of ours: nothing of ours is held
		}
		out = append(out, j)
	}
	sort.Slice(out, func(a, b int) bool { return lastFact(out[a]).Before(lastFact(out[b])) })
	if r.Limit > 0 && len(out) > r.Limit {
		out = out[:r.Limit]
	}
	return out
}

func lastFact(j *events.Job) time.Time {
	t := j.QueuedAt
	if j.StartedAt.After(t) {
		t = j.StartedAt
	}
	return t
}

// ReconcileFact turns GitHub's answer into the fact the webhook would have
// carried, or nil when the log already knows as much. Only a positive
// answer moves a job (law 7): an error or a 404 changes nothing.
func ReconcileFact(j *events.Job, s JobState) events.Payload {
	ref := events.JobRef{JobID: j.ID, RunID: j.RunID, RunAttempt: j.RunAttempt, Org: j.Org, Repo: j.Repo, Name: j.Name, Labels: j.Labels}
	if ref.Labels == nil {
		ref.Labels = []string{}
	}
	switch {
	case s.Status == "completed":
		return events.JobCompleted{JobRef: ref, Conclusion: s.Conclusion, RunnerName: s.RunnerName, RunnerID: s.RunnerID}
	case s.Status == "in_progress" && j.Status == events.StatusQueued && s.RunnerName != "":
		return events.JobInProgress{JobRef: ref, RunnerName: s.RunnerName, RunnerID: s.RunnerID}
	}
	return nil
}

// JobState implements the reconcile read with go-github.
func (m *GitHubMinter) JobState(ctx context.Context, owner, repo string, id int64) (JobState, error) {
	j, resp, err := m.Client.Actions.GetWorkflowJobByID(ctx, owner, repo, id)
	if m.Budget != nil {
		var hr *http.Response
		if resp != nil {
			hr = resp.Response
		}
		m.Budget.Observe(hr, err, time.Now())
	}
	if err != nil {
		return JobState{}, fmt.Errorf("get job %d: %w", id, err)
	}
	return JobState{Status: j.GetStatus(), Conclusion: j.GetConclusion(), RunnerName: j.GetRunnerName(), RunnerID: j.GetRunnerID()}, nil
}
