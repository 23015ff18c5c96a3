package dispatch

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/google/go-github/v62/github"
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
// for longer than After; at most Limit. Jobs in progress on our runners
// come first, each oldest first: their runners hold slots, and a deep
// backlog of queued jobs (which stay candidates while GitHub says they
// wait) must not keep a lost completion from being found. It is pure.
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
	sort.Slice(out, func(a, b int) bool {
		if ra, rb := out[a].Status == events.StatusInProgress, out[b].Status == events.StatusInProgress; ra != rb {
			return ra
		}
		return lastFact(out[a]).Before(lastFact(out[b]))
	})
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
	ref := events.JobRef{JobID: j.ID, RunID: j.RunID, RunAttempt: j.RunAttempt, Org: j.Org, Repo: j.Repo, Name: j.Name, Labels: j.Labels,
		Installation: j.Installation}
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
	m.Budget.ObserveAPI(resp, err)
	if err != nil {
		return JobState{}, fmt.Errorf("get job %d: %w", id, err)
	}
	return JobState{Status: j.GetStatus(), Conclusion: j.GetConclusion(), RunnerName: j.GetRunnerName(), RunnerID: j.GetRunnerID()}, nil
}

// QueuedJob is a job the REST API lists as queued.
type QueuedJob struct {
	ID, RunID, RunAttempt int64
	Org, Repo, Name       string
	Labels                []string
}

// QueuedLister is implemented by a Minter that can list a repository's
// queued jobs: how the reconcile poll finds a job whose queued webhook
// GitHub never even tried to deliver.
type QueuedLister interface {
	QueuedJobs(ctx context.Context, owner, repo string, runs int) ([]QueuedJob, error)
}

// ReconcileRepos is the repositories the poll searches for queued jobs
// through one installation's client ("": the default): every owner/repo a
// job fact of that installation in the fold's retention names, sorted.
func ReconcileRepos(f *events.Fleet, installation string) [][2]string {
	out := f.Repos(installation)
	sort.Slice(out, func(a, b int) bool { return out[a][0]+"/"+out[a][1] < out[b][0]+"/"+out[b][1] })
	return out
}

// UnknownQueued turns the listed queued jobs the fold does not know into
// the facts their lost queued webhooks would have carried (no delivery id:
// the fact's id is job-<id>-queued, so finding a job twice stores it once).
// It is pure.
func UnknownQueued(f *events.Fleet, jobs []QueuedJob, installation string) []events.JobQueued {
	var out []events.JobQueued
	for _, q := range jobs {
		if q.ID <= 0 || f.KnownJob(q.ID) {
			continue
		}
		labels := q.Labels
		if labels == nil {
			labels = []string{}
		}
		out = append(out, events.JobQueued{JobRef: events.JobRef{JobID: q.ID, RunID: q.RunID, RunAttempt: q.RunAttempt,
			Org: q.Org, Repo: q.Repo, Name: q.Name, Labels: labels, Installation: installation}})
	}
	return out
}

// QueuedJobs implements QueuedLister: GET /repos/{o}/{r}/actions/runs with
// status queued, then in_progress (a run in progress can hold queued jobs),
// and GET …/runs/{run_id}/jobs for at most runs runs; the jobs listed
// queued are returned.
func (m *GitHubMinter) QueuedJobs(ctx context.Context, owner, repo string, runs int) ([]QueuedJob, error) {
	var out []QueuedJob
	read := 0
	for _, status := range []string{"queued", "in_progress"} {
		list, resp, err := m.Client.Actions.ListRepositoryWorkflowRuns(ctx, owner, repo,
			&github.ListWorkflowRunsOptions{Status: status, ListOptions: github.ListOptions{PerPage: 100}})
		m.observe(resp, err)
		if err != nil {
			return out, fmt.Errorf("list %s runs of %s/%s: %w", status, owner, repo, err)
		}
		for _, run := range list.WorkflowRuns {
			if read >= runs {
				return out, nil
			}
			read++
			jobs, resp, err := m.Client.Actions.ListWorkflowJobs(ctx, owner, repo, run.GetID(),
				&github.ListWorkflowJobsOptions{Filter: "latest", ListOptions: github.ListOptions{PerPage: 100}})
			m.observe(resp, err)
			if err != nil {
				return out, fmt.Errorf("list jobs of run %d: %w", run.GetID(), err)
			}
			for _, j := range jobs.Jobs {
				if j.GetStatus() == "queued" {
					out = append(out, QueuedJob{ID: j.GetID(), RunID: j.GetRunID(), RunAttempt: j.GetRunAttempt(),
						Org: owner, Repo: repo, Name: j.GetName(), Labels: j.Labels})
				}
			}
		}
	}
	return out, nil
}

// RunLister is a QueuedLister that pages: how the scale set reconciler
// searches a backlog deeper than one page of runs.
type RunLister interface {
	QueuedJobsIn(ctx context.Context, owner, repo string, calls int, skip func(runID int64) bool) (jobs []QueuedJob, read []int64, err error)
}

// QueuedJobsIn implements RunLister: the repository's queued runs, then
// those in progress (a run in progress can hold queued jobs), oldest first
// (GitHub lists newest first, so the pages are walked from the last: the
// jobs waiting longest are the ones a lost message hides), and the jobs of
// each run skip does not exclude (GET …/runs/{run_id}/jobs). calls bounds
// every call made, lists included. It returns the jobs listed queued and
// the runs whose jobs were read. A failed call ends the read with what was
// found so far.
func (m *GitHubMinter) QueuedJobsIn(ctx context.Context, owner, repo string, calls int, skip func(int64) bool) ([]QueuedJob, []int64, error) {
	var out []QueuedJob
	var read []int64
	list := func(status string, page int) (*github.WorkflowRuns, *github.Response, error) {
		calls--
		runs, resp, err := m.Client.Actions.ListRepositoryWorkflowRuns(ctx, owner, repo,
			&github.ListWorkflowRunsOptions{Status: status, ListOptions: github.ListOptions{PerPage: 100, Page: page}})
		m.observe(resp, err)
		if err != nil {
			return nil, nil, fmt.Errorf("list %s runs of %s/%s: %w", status, owner, repo, err)
		}
		return runs, resp, nil
	}
	for _, status := range []string{"queued", "in_progress"} {
		if calls <= 0 {
			break
		}
		runs, resp, err := list(status, 1)
		if err != nil {
			return out, read, err
		}
		for page := max(resp.LastPage, 1); page >= 1 && calls > 0; page-- {
			if page != 1 {
				if runs, _, err = list(status, page); err != nil {
					return out, read, err
				}
			} else if resp.LastPage > 1 {
				if runs, _, err = list(status, 1); err != nil { // page 1 moved on while the older pages were read
					return out, read, err
				}
			}
			for _, run := range slices.Backward(runs.WorkflowRuns) {
				if calls <= 0 {
					break
				}
				if skip != nil && skip(run.GetID()) {
					continue
				}
				calls--
				read = append(read, run.GetID())
				jobs, resp, err := m.Client.Actions.ListWorkflowJobs(ctx, owner, repo, run.GetID(),
					&github.ListWorkflowJobsOptions{Filter: "latest", ListOptions: github.ListOptions{PerPage: 100}})
				m.observe(resp, err)
				if err != nil {
					return out, read, fmt.Errorf("list jobs of run %d: %w", run.GetID(), err)
				}
				for _, j := range jobs.Jobs {
					if j.GetStatus() == "queued" {
						out = append(out, QueuedJob{ID: j.GetID(), RunID: j.GetRunID(), RunAttempt: j.GetRunAttempt(),
							Org: owner, Repo: repo, Name: j.GetName(), Labels: j.Labels})
					}
				}
			}
		}
	}
	return out, read, nil
}

func (m *GitHubMinter) observe(resp *github.Response, err error) { m.Budget.ObserveAPI(resp, err) }

// findQueued runs off the loop: it lists each repository's queued jobs
// (at most limit runs read a round in all) and appends, from the loop, a
// queued fact for each job the fold does not know. A failed read changes
// nothing (law 7).
func (d *Dispatcher) findQueued(ctx context.Context, in Installation, lister QueuedLister, repos [][2]string, limit int) {
	if limit <= 0 {
		limit = 20
	}
	var found []QueuedJob
	for _, rp := range repos {
		if blocked, _ := in.blocked(time.Now()); blocked || limit <= 0 {
			break
		}
		cctx, cancel := context.WithTimeout(ctx, d.opts.MintTimeout)
		jobs, err := lister.QueuedJobs(cctx, rp[0], rp[1], limit)
		cancel()
		limit -= len(jobs) + 1
		if err != nil {
			d.opts.Logger.Debug("queued jobs not listed; nothing changes on a failed read", "org", rp[0], "repo", rp[1], "err", err)
		}
		found = append(found, jobs...)
	}
	if len(found) == 0 {
		return
	}
	d.Loop.Post(ctx, func() {
		if set := d.opts.ScaleSetJob; set != nil {
			found = slices.DeleteFunc(found, func(j QueuedJob) bool { return set(d.Fold, j.Labels) })
		}
		for _, q := range UnknownQueued(d.Fold, found, in.Name) {
			d.opts.Logger.Warn("a queued job no webhook told of; the API lists it", "job", q.JobID, "org", q.Org, "repo", q.Repo)
			_ = d.Append(ctx, q)
		}
	})
}
