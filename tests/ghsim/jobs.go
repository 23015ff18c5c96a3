package ghsim

import (
	"cmp"
	"slices"
	"strings"
	"time"
)

// Job statuses and conclusions, as in GitHub's workflow_job payloads.
const (
	StatusQueued     = "queued"
	StatusInProgress = "in_progress"
	StatusCompleted  = "completed"

	ConclusionSuccess   = "success"
	ConclusionFailure   = "failure"
	ConclusionCancelled = "cancelled"
)

// defaultRunnerGroupID is GitHub's "Default" runner group.
const defaultRunnerGroupID = 1

// JobSpec describes a workflow job to queue, like a workflow run whose single job
// has `runs-on: Labels`.
type JobSpec struct {
	// Labels are the job's runs-on labels, e.g. ["self-hosted","linux"]. A runner
	// may take the job only if it has every label (case-insensitive).
	Labels []string
	// Duration is how long the runner "runs" the job before completing it.
	Duration time.Duration
	// Conclusion is the job's result: "success" (default) or "failure".
	Conclusion string
	// Name is the job name (workflow_job.name); default "build".
	Name string
}

// JobView is a snapshot of one job.
type JobView struct {
	ID, RunID  int64
	Name       string
	Labels     []string
	Status     string // "queued", "in_progress" or "completed"
	Conclusion string // "" until completed; then "success", "failure" or "cancelled"
	RunnerID   int64  // 0 until assigned
	RunnerName string // "" until assigned
	QueuedAt   time.Time
	StartedAt  time.Time // zero until a runner took the job
	// CompletedAt is zero until the job completed or was cancelled.
	CompletedAt time.Time
	// Completions counts the "completed" webhooks produced for the job (not
	// counting Redeliver); more than 1 would be a simulator bug.
	Completions int
	// ScaleSet is the id of the runner scale set that held the job, 0 if
	// none (it was served through webhooks and REST runners).
	ScaleSet int
}

// RunnerView is a snapshot of one registered (not yet deleted) runner.
type RunnerView struct {
	ID     int64
	Name   string
	Labels []string
	// Scope is "org" or "repo": which generate-jitconfig endpoint created it and
	// therefore which list/get/delete endpoints see it, as on GitHub.
	Scope  string
	Status string // "online" while it polls for or runs a job, else "offline"
	Busy   bool   // true while it runs a job
	JobID  int64  // job it was handed, 0 if none
}

type job struct {
	id, runID       int64
	name            string
	labels          []string
	duration        time.Duration
	want            string // conclusion requested by JobSpec
	status          string
	conclusion      string
	runnerID        int64
	runnerName      string
	runnerGroupID   int64
	runnerGroupName string
	queuedAt        time.Time
	startedAt       time.Time
	completedAt     time.Time
	completions     int
	set             int       // scale set holding the job, 0 if none
	setState        int       // setAvailable, setAcquired or setAssigned
	offeredAt       time.Time // last JobAvailable
}

type runner struct {
	id         int64
	name       string
	labels     []string
	groupID    int64
	workFolder string
	scope      string
	token      string
	polling    int   // in-flight acquire requests
	jobID      int64 // job handed to this runner
	deleted    bool  // removed through DELETE or after its job
	set        int   // scale set that minted the runner, 0 if REST
}

func (r *runner) online() bool { return !r.deleted && (r.polling > 0 || r.jobID != 0) }
func (r *runner) busy() bool   { return !r.deleted && r.jobID != 0 }

// Enqueue creates a queued job with a fresh job id and a fresh run id (one run per
// job), queues a workflow_job "queued" webhook and wakes waiting runners. It never
// blocks on HTTP. It returns the job id.
func (s *Sim) Enqueue(spec JobSpec) int64 {
	want := spec.Conclusion
	if want != ConclusionFailure {
		want = ConclusionSuccess
	}
	name := spec.Name
	if name == "" {
		name = "build"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextJobID++
	s.nextRunID++
	j := &job{
		id: s.nextJobID, runID: s.nextRunID, name: name,
		labels: slices.Clone(spec.Labels), duration: spec.Duration, want: want,
		status: StatusQueued, queuedAt: time.Now().UTC(),
	}
	s.jobs = append(s.jobs, j)
	s.jobByID[j.id] = j
	s.emitJobLocked("queued", j)
	s.offerLocked(j)
	s.notifyLocked()
	s.log.Info("job queued", "job_id", j.id, "run_id", j.runID, "labels", j.labels)
	return j.id
}

// Cancel cancels a job that is still queued and unassigned, as when a workflow
// run is cancelled before any runner picked the job: the job becomes completed /
// cancelled and a "completed" webhook is queued with conclusion "cancelled",
// runner_id 0 and runner_name "" (like the fixture
// workflow_job.completed.cancelled.self-hosted-arm64.partial.json). It returns
// false for unknown, assigned or finished jobs.
func (s *Sim) Cancel(jobID int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	j := s.jobByID[jobID]
	if j == nil || j.status != StatusQueued || j.runnerID != 0 {
		return false
	}
	now := time.Now().UTC()
	j.status, j.conclusion = StatusCompleted, ConclusionCancelled
	j.startedAt, j.completedAt = now, now
	j.completions++
	s.emitJobLocked("completed", j)
	s.setEventLocked(j, "JobCompleted", nil)
	s.notifyLocked()
	s.log.Info("job cancelled", "job_id", j.id)
	return true
}

// Jobs returns a snapshot of all jobs in enqueue order.
func (s *Sim) Jobs() []JobView {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]JobView, 0, len(s.jobs))
	for _, j := range s.jobs {
		out = append(out, JobView{
			ID: j.id, RunID: j.runID, Name: j.name, Labels: slices.Clone(j.labels),
			Status: j.status, Conclusion: j.conclusion,
			RunnerID: j.runnerID, RunnerName: j.runnerName,
			QueuedAt: j.queuedAt, StartedAt: j.startedAt, CompletedAt: j.completedAt,
			Completions: j.completions, ScaleSet: j.set,
		})
	}
	return out
}

// Runners returns a snapshot of the registered runners (JIT-configured and not
// yet deleted), ordered by id.
func (s *Sim) Runners() []RunnerView {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]RunnerView, 0, len(s.runners))
	for _, r := range s.sortedRunnersLocked("") {
		out = append(out, s.runnerViewLocked(r))
	}
	return out
}

func (s *Sim) runnerViewLocked(r *runner) RunnerView {
	st := "offline"
	if r.online() {
		st = "online"
	}
	return RunnerView{ID: r.id, Name: r.name, Labels: slices.Clone(r.labels), Scope: r.scope,
		Status: st, Busy: r.busy(), JobID: r.jobID}
}

// sortedRunnersLocked returns registered runners of the given scope ("" = all) by id.
func (s *Sim) sortedRunnersLocked(scope string) []*runner {
	out := make([]*runner, 0, len(s.runners))
	for _, r := range s.runners {
		if scope == "" || r.scope == scope {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b *runner) int { return cmp.Compare(a.id, b.id) })
	return out
}

// labelsMatch reports whether every job label is among the runner labels,
// ignoring case, which is how GitHub routes jobs to self-hosted runners.
func labelsMatch(jobLabels, runnerLabels []string) bool {
	for _, jl := range jobLabels {
		if !slices.ContainsFunc(runnerLabels, func(rl string) bool { return strings.EqualFold(jl, rl) }) {
			return false
		}
	}
	return true
}

// open reports whether j waits for a runner: queued, unassigned.
func (j *job) open() bool { return j.status == StatusQueued && j.runnerID == 0 }

// openJobsLocked is jobs from the oldest that may still be open, in
// enqueue order (firstOpen).
func (s *Sim) openJobsLocked() []*job {
	for s.firstOpen < len(s.jobs) && !s.jobs[s.firstOpen].open() {
		s.firstOpen++
	}
	return s.jobs[s.firstOpen:]
}

// pickJobLocked returns the oldest queued, unassigned job the runner can take.
// A scale set's runner walks the open jobs for those GitHub assigned to its
// set; any other runner looks only at the oldest job of each label set
// (restJobsLocked).
func (s *Sim) pickJobLocked(r *runner) *job {
	if r.set != 0 {
		for _, j := range s.openJobsLocked() {
			if j.open() && mayTake(r, j) {
				return j
			}
		}
		return nil
	}
	var best *job
	for _, q := range s.restJobsLocked() {
		if (best == nil || q.jobs[0].id < best.id) && labelsMatch(q.labels, r.labels) {
			best = q.jobs[0]
		}
	}
	return best
}

// labelQueue is the jobs of one label set (the same labels, ignoring case,
// order and repeats) that a runner of no scale set may still take, in
// enqueue order: the first of them is open, the rest may not be any more.
type labelQueue struct {
	labels []string // the first job's: every job here matches the same runners
	jobs   []*job
}

// restTakeable: a runner of no scale set can take j now, and once it
// cannot it never can again (a job only moves on from queued, and a set
// never gives a job back).
func restTakeable(j *job) bool { return j.open() && j.set == 0 }

// restJobsLocked is the label sets that have a job a runner of no scale
// set may take, each from its oldest such job. A pick used to walk every
// open job from the oldest: a runner whose labels matched none of a
// backlog (a macOS runner behind thousands of Linux jobs) walked all of it
// each time it was woken, and every change wakes every polling runner, so
// the simulator's matching grew with the backlog (4.5% of a 20,000-job
// throughput run's CPU). Jobs are indexed as they are found in s.jobs, so a test
// may build s.jobs directly.
func (s *Sim) restJobsLocked() map[string]*labelQueue {
	if s.byLabels == nil {
		s.byLabels = map[string]*labelQueue{}
	}
	for ; s.indexed < len(s.jobs); s.indexed++ {
		j := s.jobs[s.indexed]
		if !restTakeable(j) {
			continue
		}
		key := labelKey(j.labels)
		q := s.byLabels[key]
		if q == nil {
			q = &labelQueue{labels: j.labels}
			s.byLabels[key] = q
		}
		q.jobs = append(q.jobs, j)
	}
	for key, q := range s.byLabels {
		i := 0
		for i < len(q.jobs) && !restTakeable(q.jobs[i]) {
			i++
		}
		if i == len(q.jobs) {
			delete(s.byLabels, key)
			continue
		}
		q.jobs = q.jobs[i:]
	}
	return s.byLabels
}

// labelKey names a label set as GitHub matches it: lower case, sorted,
// without repeats.
func labelKey(labels []string) string {
	ls := make([]string, len(labels))
	for i, l := range labels {
		ls[i] = strings.ToLower(l)
	}
	slices.Sort(ls)
	return strings.Join(slices.Compact(ls), "\x00")
}

// assignLocked hands job j to runner r and queues the "in_progress" webhook.
func (s *Sim) assignLocked(r *runner, j *job) {
	j.status = StatusInProgress
	j.startedAt = time.Now().UTC()
	j.runnerID, j.runnerName = r.id, r.name
	j.runnerGroupID, j.runnerGroupName = r.groupID, runnerGroupName(r.groupID)
	r.jobID = j.id
	s.emitJobLocked("in_progress", j)
	s.setEventLocked(j, "JobStarted", r)
	s.notifyLocked()
	s.log.Info("job assigned", "job_id", j.id, "runner", r.name, "runner_id", r.id)
}

// completeLocked finishes runner r's job with the conclusion, queues the
// "completed" webhook and deletes the ephemeral runner, as GitHub does.
func (s *Sim) completeLocked(r *runner, j *job, conclusion string) {
	j.status, j.conclusion = StatusCompleted, conclusion
	j.completedAt = time.Now().UTC()
	j.completions++
	s.emitJobLocked("completed", j)
	s.setEventLocked(j, "JobCompleted", r)
	r.deleted = true
	s.unregisterLocked(r)
	s.notifyLocked()
	s.log.Info("job completed", "job_id", j.id, "runner", r.name, "conclusion", conclusion)
}

func runnerGroupName(id int64) string {
	if id == defaultRunnerGroupID {
		return "Default"
	}
	return "group-" + itoa(id)
}
