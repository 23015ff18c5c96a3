package setintake

import (
	"context"
	"log/slog"
	"time"

	"github.com/actions/scaleset"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/dispatch"
)

// DefaultReconcileEvery bounds how often a set's gap sends REST reads
// when Intake.ReconcileEvery is 0.
const DefaultReconcileEvery = time.Minute

// REST is what the reconciler reads from the REST API: queued jobs of a
// repository's runs (dispatch.GitHubMinter).
type REST interface {
	dispatch.RunLister
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
	in    *Intake
	pool  string
	log   *slog.Logger
	stats *scaleset.RunnerScaleSetStatistic
	// openAtStats is the pool's open jobs on the first complete fold after
	// stats came (-1: not judged yet). Statistics are GitHub's count when
	// their message was sent; a round without a message judges them
	// against this too, since a job completed since then leaves the fold
	// and not the count: against the fold alone, that was a gap.
	openAtStats int
	rounds      int
	// stored is the stream sequence of the last fact this set's intake
	// stored: a fold that has not reached it lacks jobs GitHub already
	// counts (the JobAssigned of the poll that brought the statistics).
	stored uint64
	last   time.Time
	repos  map[[2]string]bool  // repositories the set's messages named
	clean  map[int64]time.Time // run → when it was read holding nothing missing
}

func newReconciler(in *Intake, set *scaleset.RunnerScaleSet, log *slog.Logger) *reconciler {
	return &reconciler{in: in, pool: set.Name, log: log, openAtStats: -1, repos: map[[2]string]bool{}, clean: map[int64]time.Time{}}
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
// empty poll: the last ones stand, judged against the fold now and as it
// was when they came, the smaller gap counting). When they came on a
// partial view, "when they came" is the first complete fold after it: a
// job completed in between still reads as a gap for those rounds.
func (r *reconciler) round(ctx context.Context, stats *scaleset.RunnerScaleSetStatistic) {
	if stats != nil {
		r.stats, r.openAtStats = stats, -1
	}
	if r.in.Lister == nil {
		return
	}
	var open int
	var labels []string
	var repos [][2]string
	var folded uint64
	if err := r.in.Read(ctx, func(f *events.Fleet) {
		open, labels, repos = OpenJobs(f, r.pool), f.PoolLabels()[r.pool], dispatch.ReconcileRepos(f, r.in.Installation)
		folded = f.LastSeq
	}); err != nil || folded < r.stored {
		// A partial view: the gap would count the jobs whose facts this
		// intake stored and the fold has not reached, and the REST API
		// lists as queued the jobs acquired and not assigned too, so
		// filling it could store a job GitHub never assigned, and the
		// capacity would then let GitHub assign one job too many. The
		// round does not count.
		return
	}
	if r.openAtStats < 0 {
		r.openAtStats = open
	}
	gap := min(Gap(r.stats, open), Gap(r.stats, r.openAtStats))
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
	_ = r.in.Read(ctx, func(f *events.Fleet) { missing = dispatch.UnknownQueued(f, found, r.in.Installation) })
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
