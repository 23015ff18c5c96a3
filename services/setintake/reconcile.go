package setintake

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/actions/scaleset"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/dispatch"
)

// DefaultReconcileEvery bounds how often a set's gap sends REST reads
// when Intake.ReconcileEvery is 0.
const DefaultReconcileEvery = time.Minute

// REST is what the reconciler reads from the REST API: queued jobs of a
// repository's runs, and one job's state (dispatch.GitHubMinter).
type REST interface {
	dispatch.RunLister
	JobState(ctx context.Context, owner, repo string, id int64) (dispatch.JobState, error)
	// Spare: the REST budget allows an optional read (dispatch.Budget.Spare).
	Spare() bool
}

// DefaultReconcileLimit bounds the runs one round reads (one call each)
// when Intake.ReconcileLimit is 0.
const DefaultReconcileLimit = 20

// cleanFor is how long a run found with no unknown queued job of the pool
// is not read again: a later job of it (a dependent job queued when its
// needs finish) is found after that, if its message was lost too.
const cleanFor = 10 * time.Minute

// reconciler closes the gap between GitHub's statistics and the fold: a
// JobAssigned lost or emptied leaves GitHub counting a job the fold does
// not know. A gap seen in two polls in a row (one poll's gap may be facts
// not folded yet) is filled from the REST API's queued jobs that carry the
// pool's labels and the fold does not know, at most the gap's size. Only
// what a read lists is added; a failed read changes nothing (law 7).
type reconciler struct {
	in     *Intake
	pool   string
	log    *slog.Logger
	stats  *scaleset.RunnerScaleSetStatistic
	rounds int
	last   time.Time
	repos  map[[2]string]bool  // repositories the set's messages named
	clean  map[int64]time.Time // run → when it was read holding nothing missing
	// idleSince: attempt → when this reconciler first saw its runner
	// idle, on its own clock; lastGone paces the runner checks.
	idleSince map[string]time.Time
	lastGone  time.Time
	// asked: job → when the REST API last said it had not moved on;
	// lastMoved paces the checks, movedRounds counts rounds in a row the
	// statistics said some had.
	asked       map[int64]time.Time
	lastMoved   time.Time
	movedRounds int
}

func newReconciler(in *Intake, set *scaleset.RunnerScaleSet, log *slog.Logger) *reconciler {
	return &reconciler{in: in, pool: set.Name, log: log, repos: map[[2]string]bool{}, clean: map[int64]time.Time{},
		idleSince: map[string]time.Time{}, asked: map[int64]time.Time{}}
}

// seen remembers the repositories a message's jobs belong to: with every
// JobAssigned lost, the fold would name none.
func (r *reconciler) seen(m *scaleset.RunnerScaleSetMessage) {
	add := func(b scaleset.JobMessageBase) {
		if b.OwnerName != "" && b.RepositoryName != "" {
			r.repos[[2]string{b.OwnerName, b.RepositoryName}] = true
		}
	}
	for _, a := range m.JobAvailableMessages {
		add(a.JobMessageBase)
	}
	for _, a := range m.JobAssignedMessages {
		add(a.JobMessageBase)
	}
}

// Gap is how many assigned jobs the fold is missing: GitHub's
// TotalAssignedJobs less the pool's open jobs, never below 0.
func Gap(stats *scaleset.RunnerScaleSetStatistic, open int) int {
	if stats == nil {
		return 0
	}
	return max(0, stats.TotalAssignedJobs-open)
}

// round runs after every poll with the message's statistics (nil on an
// empty poll: the last ones stand).
func (r *reconciler) round(ctx context.Context, stats *scaleset.RunnerScaleSetStatistic) {
	if stats != nil {
		r.stats = stats
	}
	r.gone(ctx)
	if r.in.Lister == nil {
		return
	}
	r.moved(ctx)
	var open int
	var labels []string
	var repos [][2]string
	_ = r.in.Read(ctx, func(f *events.Fleet) {
		open, labels, repos = OpenJobs(f, r.pool), f.PoolLabels()[r.pool], dispatch.ReconcileRepos(f)
	})
	gap := Gap(r.stats, open)
	if gap == 0 {
		r.rounds = 0
		return
	}
	r.rounds++
	now := r.in.Clock.Now()
	every := r.in.ReconcileEvery
	if every <= 0 {
		every = DefaultReconcileEvery
	}
	if r.rounds < 2 || now.Sub(r.last) < every {
		return
	}
	r.rounds, r.last = 0, now
	if !r.in.Lister.Spare() {
		r.log.Info("statistics gap not searched: the REST budget is down to its reserve", "gap", gap)
		return
	}
	r.fill(ctx, gap, labels, repos)
}

// fill searches the repositories' queued runs, newest first, for queued
// jobs with the pool's labels the fold does not know, and stores at most
// gap of them. A run found holding none is clean and skipped for
// cleanFor, so a backlog deeper than one round's reads is searched a
// little further each round instead of rereading the newest runs.
func (r *reconciler) fill(ctx context.Context, gap int, labels []string, repos [][2]string) {
	for _, rp := range repos {
		r.repos[rp] = true
	}
	now := r.in.Clock.Now()
	for run, at := range r.clean {
		if now.Sub(at) >= cleanFor {
			delete(r.clean, run)
		}
	}
	skip := func(run int64) bool { _, ok := r.clean[run]; return ok }
	budget := r.in.ReconcileLimit
	if budget <= 0 {
		budget = DefaultReconcileLimit
	}
	var found []dispatch.QueuedJob
	var read []int64
	for rp := range r.repos {
		if budget <= 0 {
			break
		}
		jobs, runs, err := r.in.Lister.QueuedJobsIn(ctx, rp[0], rp[1], budget, skip)
		budget -= len(runs) + 1
		read = append(read, runs...)
		if err != nil {
			r.log.Debug("queued jobs not listed; nothing changes on a failed read", "org", rp[0], "repo", rp[1], "err", err)
		}
		for _, j := range jobs {
			if events.Serves(labels, j.Labels) {
				found = append(found, j)
			}
		}
	}
	var missing []events.JobQueued
	_ = r.in.Read(ctx, func(f *events.Fleet) { missing = dispatch.UnknownQueued(f, found) })
	dirty := map[int64]bool{}
	for _, q := range missing {
		dirty[q.RunID] = true
	}
	for _, run := range read {
		if !dirty[run] {
			r.clean[run] = now
		}
	}
	for i, q := range missing {
		if i >= gap {
			break
		}
		r.log.Warn("a job the scale set counts as assigned that no message told of; the API lists it", "job", q.JobID)
		if _, err := r.in.Log.AppendConfirmed(ctx, r.in.Log.New(r.in.Clock.Now(), q), nil); err == nil {
			r.in.Metrics.add(&r.in.Metrics.Reconciled, 1)
		}
	}
}

// idleGrace is how long the reconciler must have seen a runner idle before
// it asks GitHub whether the runner is still there.
const idleGrace = 5 * time.Second

// gone finds the pool's idle runners GitHub no longer has. Any idle runner
// of a scale set may take any of the set's jobs; when the messages telling
// of that job were lost, the fold still counts the runner idle after GitHub
// removed it (it is ephemeral), and its slot stays held until the
// registration timeout. So when the fold counts more idle runners than the
// statistics do, each runner seen idle for idleGrace is looked up, at most
// ReconcileLimit a round, once per ReconcileEvery; one GitHub answers "not
// found" for is stored as AttemptDeregistered, which releases its slot
// (the job it was booked for stays demand). A failed read changes nothing
// (law 7).
func (r *reconciler) gone(ctx context.Context) {
	if r.stats == nil || r.in.Client == nil {
		return
	}
	now := r.in.Clock.Now()
	type idle struct {
		ref    events.AttemptRef
		runner int64
	}
	var seen []idle
	_ = r.in.Read(ctx, func(f *events.Fleet) {
		for a := range f.LiveAttempts() {
			if a.Pool == r.pool && a.Held() && a.Placed && a.RunnerStarted && a.RunnerID != 0 && !a.Deregistered && f.BoundJob(a.ID) == 0 {
				seen = append(seen, idle{events.AttemptRef{Attempt: a.ID, Pool: a.Pool, Host: a.Host}, a.RunnerID})
			}
		}
	})
	still := make(map[string]time.Time, len(seen))
	var due []idle
	for _, i := range seen {
		since, ok := r.idleSince[i.ref.Attempt]
		if !ok {
			since = now
		}
		still[i.ref.Attempt] = since
		if now.Sub(since) >= idleGrace {
			due = append(due, i)
		}
	}
	r.idleSince = still
	every := cmp.Or(r.in.ReconcileEvery, DefaultReconcileEvery)
	if len(seen) <= r.stats.TotalIdleRunners || len(due) == 0 || now.Sub(r.lastGone) < every {
		return
	}
	r.lastGone = now
	for i, d := range due {
		if i >= cmp.Or(r.in.ReconcileLimit, DefaultReconcileLimit) {
			break
		}
		_, err := r.in.Client.GetRunner(ctx, int(d.runner))
		if !errors.Is(err, scaleset.RunnerNotFoundError) {
			continue // there, or the read failed: nothing changes
		}
		r.log.Warn("an idle runner GitHub no longer has: it took a job no message told of; its slot goes back", "attempt", d.ref.Attempt, "runner_id", d.runner)
		gone := events.AttemptDeregistered{AttemptRef: d.ref, RunnerID: d.runner}
		if _, err := r.in.Log.AppendConfirmed(ctx, r.in.Log.New(now, gone), nil); err == nil {
			r.in.Metrics.add(&r.in.Metrics.RunnersGone, 1)
			delete(r.idleSince, d.ref.Attempt)
		}
	}
}

// askedFor is how long a job the REST API said had not moved on is not
// asked about again, so the checks go round the pool's jobs instead of
// asking the oldest over and over.
const askedFor = 10 * time.Minute

// moved finds the pool's jobs that moved on while their messages were lost:
// when the fold holds more jobs in progress than the statistics count
// running, some finished unseen (their runners' slots stay held); when it
// holds more queued than GitHub counts assigned and waiting, some started or
// were cancelled unseen. Only then, and only when two rounds in a row agree
// (one may be facts not folded yet), the oldest of them are asked about
// (GET …/actions/jobs/{id}), at most the excess and ReconcileLimit a round,
// once per ReconcileEvery; each answer that says more than the log becomes
// the fact a lost message would have carried (dispatch.ReconcileFact). A
// failed read changes nothing (law 7). Asking only on a disagreement keeps
// the REST budget for the fleet: a backlog of thousands of assigned jobs
// costs nothing while the counts agree.
func (r *reconciler) moved(ctx context.Context) {
	now := r.in.Clock.Now()
	every := cmp.Or(r.in.ReconcileEvery, DefaultReconcileEvery)
	if r.stats == nil || now.Sub(r.lastMoved) < every {
		return
	}
	r.lastMoved = now
	var running, waiting []events.Job // copies: the calls run off the loop
	_ = r.in.Read(ctx, func(f *events.Fleet) {
		queued, started := PoolJobs(f, r.pool)
		for _, j := range started {
			if j.Org != "" && j.Repo != "" {
				running = append(running, *j)
			}
		}
		for _, j := range queued {
			if j.Org != "" && j.Repo != "" {
				waiting = append(waiting, *j)
			}
		}
	})
	extraRunning := len(running) - r.stats.TotalRunningJobs
	extraWaiting := len(waiting) - (r.stats.TotalAssignedJobs - r.stats.TotalRunningJobs)
	if extraRunning <= 0 && extraWaiting <= 0 {
		r.movedRounds = 0
		return
	}
	if r.movedRounds++; r.movedRounds < 2 {
		return
	}
	for id, at := range r.asked {
		if now.Sub(at) >= askedFor {
			delete(r.asked, id)
		}
	}
	budget := cmp.Or(r.in.ReconcileLimit, DefaultReconcileLimit)
	ask := r.pick(running, extraRunning, func(j events.Job) time.Time { return j.StartedAt })
	ask = append(ask, r.pick(waiting, extraWaiting, func(j events.Job) time.Time { return j.QueuedAt })...)
	for i, j := range ask {
		if i >= budget {
			break
		}
		s, err := r.in.Lister.JobState(ctx, j.Org, j.Repo, j.ID)
		if err != nil {
			r.log.Debug("job not read; nothing changes on a failed read", "job", j.ID, "err", err)
			continue
		}
		p := dispatch.ReconcileFact(&j, s)
		if p == nil {
			r.asked[j.ID] = now
			continue
		}
		r.log.Warn("a scale set message went missing; the API says the job moved on", "job", j.ID, "status", s.Status)
		if _, err := r.in.Log.AppendConfirmed(ctx, r.in.Log.New(now, p), nil); err == nil {
			r.in.Metrics.add(&r.in.Metrics.Reconciled, 1)
		}
	}
}

// pick is up to n of jobs not asked about lately, oldest (by since) first.
func (r *reconciler) pick(jobs []events.Job, n int, since func(events.Job) time.Time) []events.Job {
	if n <= 0 {
		return nil
	}
	slices.SortFunc(jobs, func(a, b events.Job) int { return since(a).Compare(since(b)) })
	var out []events.Job
	for _, j := range jobs {
		if len(out) == n {
			break
		}
		if _, ok := r.asked[j.ID]; !ok {
			out = append(out, j)
		}
	}
	return out
}
