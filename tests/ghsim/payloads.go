package ghsim

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ghTime formats t like GitHub's JSON timestamps (RFC 3339, UTC, seconds).
func ghTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format("2006-01-02T15:04:05Z")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// replaceStrings rewrites every string inside v (recursively) with r.
func replaceStrings(v any, r *strings.Replacer) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = replaceStrings(e, r)
		}
	case []any:
		for i, e := range x {
			x[i] = replaceStrings(e, r)
		}
	case string:
		return r.Replace(x)
	}
	return v
}

// apiBaseLocked is the base for "url"-style fields: the sim URL once started,
// else https://api.github.com.
func (s *Sim) apiBaseLocked() string {
	if s.baseURL != "" {
		return s.baseURL
	}
	return "https://api.github.com"
}

// setRepo points a repository object at Config.Org/Config.Repo.
func (s *Sim) setRepo(repo map[string]any) {
	repo["name"] = s.cfg.Repo
	repo["full_name"] = s.cfg.Org + "/" + s.cfg.Repo
	obj(repo, "owner")["login"] = s.cfg.Org
}

// envelope returns fresh copies of the repository, organization and sender
// objects of the queued fixture, renamed to Config.Org/Config.Repo. Every
// workflow_job webhook uses this same envelope, as one org hook would.
func (s *Sim) envelope() map[string]any {
	rep := strings.NewReplacer("MYORG", s.cfg.Org, "MYREPO", s.cfg.Repo)
	env := map[string]any{}
	for _, k := range []string{"repository", "organization", "sender"} {
		env[k] = replaceStrings(deepCopy(s.fx.hookQueued[k]), rep)
	}
	s.setRepo(env["repository"].(map[string]any))
	env["organization"].(map[string]any)["login"] = s.cfg.Org
	return env
}

// hookTemplate is the real fixture a workflow_job webhook for action and j
// is built from, and its kind (the key of its encoded members).
func (s *Sim) hookTemplate(action string, j *job) (string, map[string]any) {
	switch {
	case action == "queued":
		return "queued", s.fx.hookQueued
	case action == "in_progress":
		return "in_progress", s.fx.hookInProgress
	case j.conclusion == ConclusionCancelled && j.runnerID == 0:
		return "cancelled", s.fx.hookCancel
	case j.conclusion == ConclusionFailure:
		return "failure", s.fx.hookFailure
	}
	return "success", s.fx.hookSuccess
}

// fillJob overwrites a workflow_job object (webhook or REST shape) with j's state.
// runner_* are null while the job is queued, 0/"" for a job cancelled before any
// runner took it, and the runner's values once assigned.
func (s *Sim) fillJob(wj map[string]any, j *job, apiBase string) {
	repoAPI := apiBase + "/repos/" + s.cfg.Org + "/" + s.cfg.Repo
	labels := make([]any, len(j.labels))
	for i, l := range j.labels {
		labels[i] = l
	}
	wj["id"] = j.id
	wj["run_id"] = j.runID
	wj["run_attempt"] = 1
	wj["name"] = j.name
	wj["workflow_name"] = "CI"
	wj["head_branch"] = "main"
	wj["labels"] = labels
	wj["status"] = j.status
	wj["conclusion"] = nil
	if j.conclusion != "" {
		wj["conclusion"] = j.conclusion
	}
	wj["created_at"] = ghTime(j.queuedAt)
	wj["started_at"] = ghTime(j.queuedAt) // GitHub sets started_at when queued
	if !j.startedAt.IsZero() {
		wj["started_at"] = ghTime(j.startedAt)
	}
	wj["completed_at"] = ghTime(j.completedAt)
	wj["run_url"] = repoAPI + "/actions/runs/" + itoa(j.runID)
	wj["url"] = repoAPI + "/actions/jobs/" + itoa(j.id)
	wj["check_run_url"] = repoAPI + "/check-runs/" + itoa(j.id)
	wj["html_url"] = "https://github.com/" + s.cfg.Org + "/" + s.cfg.Repo +
		"/actions/runs/" + itoa(j.runID) + "/job/" + itoa(j.id)
	switch {
	case j.runnerID != 0:
		wj["runner_id"], wj["runner_name"] = j.runnerID, j.runnerName
		wj["runner_group_id"], wj["runner_group_name"] = j.runnerGroupID, j.runnerGroupName
	case j.status == StatusCompleted:
		wj["runner_id"], wj["runner_name"] = 0, ""
		wj["runner_group_id"], wj["runner_group_name"] = 0, ""
	default:
		wj["runner_id"], wj["runner_name"] = nil, nil
		wj["runner_group_id"], wj["runner_group_name"] = nil, nil
	}
}

// jobHookBodyLocked builds the encoded body of a workflow_job webhook for
// action from the matching real fixture: queued, in_progress, completed
// (success / failure) or the cancelled-before-assignment capture. Only
// action and workflow_job are encoded for each body; every other member
// (the envelope, and what else the fixture holds) was encoded once
// (hookMembersLocked), and the body is their bytes joined in key order,
// as encoding/json writes a map: marshalling a map of raw messages had
// encoding/json scan every one of them again to compact it, 2.5% of a
// throughput run's CPU.
func (s *Sim) jobHookBodyLocked(action string, j *job) []byte {
	kind, tpl := s.hookTemplate(action, j)
	m := s.hookMembersLocked(kind, tpl)
	wj, _ := tpl["workflow_job"].(map[string]any)
	wj = copyObj(wj)
	s.fillJob(wj, j, s.apiBaseLocked())
	if action == "queued" {
		wj["steps"] = []any{}
	}
	a, errA := json.Marshal(action)
	w, errW := json.Marshal(wj)
	if err := cmp.Or(errA, errW); err != nil { // cannot happen: decoded JSON plus scalars
		panic(fmt.Sprintf("ghsim: marshal webhook: %v", err))
	}
	body := make([]byte, 0, m.size+len(a)+len(w)+32)
	body = append(body, '{')
	for i, k := range m.keys {
		if i > 0 {
			body = append(body, ',')
		}
		body = append(body, k...)
		body = append(body, ':')
		switch v := m.raw[i]; {
		case v != nil:
			body = append(body, v...)
		case k == `"action"`:
			body = append(body, a...)
		default:
			body = append(body, w...)
		}
	}
	return append(body, '}')
}

// hookMembers are a webhook template's top-level members, in key order,
// each key quoted and each value encoded, but action's and workflow_job's
// (nil): a body fills those in.
type hookMembers struct {
	keys []string
	raw  [][]byte
	size int // bytes of the keys and values
}

// hookMembersLocked is the members of tpl, the template of kind, encoded
// on first use: the envelope's (the same repository, organization and
// sender in every webhook) in place of the fixture's own, and no
// installation (org hooks, unlike GitHub App hooks, carry none). Making
// the envelope again for each webhook (a deep copy of the fixture's
// objects, a replacement in every string, the encoding) was a third of
// all the bytes the throughput bench allocated, which the collector then
// charged to every goroutine in the process, Berth's among them.
func (s *Sim) hookMembersLocked(kind string, tpl map[string]any) *hookMembers {
	if m := s.members[kind]; m != nil {
		return m
	}
	members := maps.Clone(tpl)
	maps.Copy(members, s.envelope())
	delete(members, "installation")
	vals := map[string][]byte{"action": nil, "workflow_job": nil}
	for k, v := range members {
		if k == "action" || k == "workflow_job" {
			continue
		}
		b, err := json.Marshal(v)
		if err != nil { // cannot happen: decoded JSON
			panic(fmt.Sprintf("ghsim: marshal webhook member %s: %v", k, err))
		}
		vals[k] = b
	}
	m := &hookMembers{}
	for _, k := range slices.Sorted(maps.Keys(vals)) {
		q, _ := json.Marshal(k)
		m.keys, m.raw = append(m.keys, string(q)), append(m.raw, vals[k])
		m.size += len(q) + len(vals[k]) + 2
	}
	if s.members == nil {
		s.members = map[string]*hookMembers{}
	}
	s.members[kind] = m
	return m
}

// restJobLocked renders j in the shape of api/actions.jobs.get.200.json.
func (s *Sim) restJobLocked(j *job, apiBase string) map[string]any {
	wj := copyObj(s.fx.jobGet)
	s.fillJob(wj, j, apiBase)
	if j.status != StatusCompleted {
		wj["steps"] = []any{}
	}
	return wj
}

// restRunLocked renders j's workflow run in the shape of the workflow_runs[0]
// element of api/actions.runs.list.200.json; a run's status mirrors its one job.
func (s *Sim) restRunLocked(j *job, apiBase string) map[string]any {
	run := firstOf(s.fx.runsList, "workflow_runs")
	oldID, _ := run["id"].(float64)
	rep := strings.NewReplacer(
		"https://api.github.com", apiBase,
		"octo-org/octo-repo", s.cfg.Org+"/"+s.cfg.Repo,
		"/runs/"+itoa(int64(oldID)), "/runs/"+itoa(j.runID),
	)
	for _, k := range []string{"url", "html_url", "jobs_url", "logs_url", "check_suite_url",
		"artifacts_url", "cancel_url", "rerun_url", "workflow_url"} {
		if v, ok := run[k].(string); ok {
			run[k] = rep.Replace(v)
		}
	}
	run["id"] = j.runID
	run["run_number"] = j.runID % 100000
	run["run_attempt"] = 1
	run["name"] = "CI"
	run["head_branch"] = "main"
	run["status"] = j.status
	run["conclusion"] = nil
	if j.conclusion != "" {
		run["conclusion"] = j.conclusion
	}
	run["created_at"] = ghTime(j.queuedAt)
	run["run_started_at"] = ghTime(j.queuedAt)
	updated := j.queuedAt
	for _, t := range []time.Time{j.startedAt, j.completedAt} {
		if t.After(updated) {
			updated = t
		}
	}
	run["updated_at"] = ghTime(updated)
	for _, k := range []string{"repository", "head_repository"} {
		if r, ok := run[k].(map[string]any); ok {
			s.setRepo(r)
		}
	}
	return run
}
