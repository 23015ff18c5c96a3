package ghsim

import (
	"net/http"
	"slices"
	"time"
)

const docsActionsURL = "https://docs.github.com/rest/actions/workflow-jobs"

// handleGetJob mimics "Get a job for a workflow run": the shape of
// api/actions.jobs.get.200.json with id, run_id, status, conclusion, labels,
// timestamps and runner_* filled in; 404 for an unknown job.
func (s *Sim) handleGetJob(w http.ResponseWriter, r *http.Request) {
	id, _ := pathInt64(r, "job_id")
	base := s.baseURLFor(r)
	s.mu.Lock()
	j := s.jobByID[id]
	if j == nil {
		s.mu.Unlock()
		writeError(w, http.StatusNotFound, "Not Found", docsActionsURL)
		return
	}
	body := s.restJobLocked(j, base)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, body)
}

// runMatches reports whether a run (whose status mirrors its only job) passes the
// ?status= filter, which GitHub accepts as either a status or a conclusion.
func runMatches(j *job, filter string) bool {
	return filter == "" || filter == j.status || (j.conclusion != "" && filter == j.conclusion)
}

// handleListRuns mimics "List workflow runs for a repository": the
// workflow-run-paginated shape of api/actions.runs.list.200.json, newest first,
// with ?status= (e.g. queued) and per_page/page. Each Enqueue creates one run.
func (s *Sim) handleListRuns(w http.ResponseWriter, r *http.Request) {
	filter := r.URL.Query().Get("status")
	base := s.baseURLFor(r)
	s.mu.Lock()
	var match []*job
	for _, j := range slices.Backward(s.jobs) {
		if runMatches(j, filter) {
			match = append(match, j)
		}
	}
	lo, hi := paginate(w, r, base, len(match))
	runs := make([]any, 0, hi-lo)
	for _, j := range match[lo:hi] {
		runs = append(runs, s.restRunLocked(j, base))
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"total_count": len(match), "workflow_runs": runs})
}

// handleListRunJobs mimics "List jobs for a workflow run": the job-paginated
// shape of api/actions.runs.jobs.list.200.json; 404 for an unknown run.
func (s *Sim) handleListRunJobs(w http.ResponseWriter, r *http.Request) {
	runID, _ := pathInt64(r, "run_id")
	base := s.baseURLFor(r)
	s.mu.Lock()
	var match []*job
	for _, j := range s.jobs {
		if j.runID == runID {
			match = append(match, j)
		}
	}
	if len(match) == 0 {
		s.mu.Unlock()
		writeError(w, http.StatusNotFound, "Not Found", docsActionsURL)
		return
	}
	lo, hi := paginate(w, r, base, len(match))
	jobs := make([]any, 0, hi-lo)
	for _, j := range match[lo:hi] {
		o := firstOf(s.fx.runJobsList, "jobs")
		s.fillJob(o, j, base)
		if j.status != StatusCompleted {
			o["steps"] = []any{}
		}
		jobs = append(jobs, o)
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"total_count": len(match), "jobs": jobs})
}

// handleInstallationToken mimics "Create an installation access token for an
// app": 201 with the shape of api/apps.installation-token.201.json, a fresh
// ghs_ token and expires_at one hour from now. The JWT is not verified.
func (s *Sim) handleInstallationToken(w http.ResponseWriter, r *http.Request) {
	body := copyObj(s.fx.installToken)
	body["token"] = "ghs_" + randHex(18)
	body["expires_at"] = ghTime(time.Now().Add(time.Hour))
	if repos, ok := body["repositories"].([]any); ok {
		for _, rp := range repos {
			if m, ok := rp.(map[string]any); ok {
				s.setRepo(m)
			}
		}
	}
	writeJSON(w, http.StatusCreated, body)
}

// handleRateLimit mimics "Get rate limit status for the authenticated user": the
// body of api/rate_limit.200.json with core/rate reflecting the sim's counters
// and every reset in the future.
func (s *Sim) handleRateLimit(w http.ResponseWriter, r *http.Request) {
	body := copyObj(s.fx.rateLimit)
	s.mu.Lock()
	used, reset := s.rlUsed, s.rlReset.Unix()
	s.mu.Unlock()
	core := map[string]any{"limit": rateLimitPerHour, "used": used, "remaining": rateLimitPerHour - used, "reset": reset}
	body["rate"] = core
	res := obj(body, "resources")
	for k, v := range res {
		if m, ok := v.(map[string]any); ok {
			m["reset"] = reset
		}
		if k == "core" {
			res[k] = core
		}
	}
	writeJSON(w, http.StatusOK, body)
}
