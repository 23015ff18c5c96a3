package dispatch

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/clock"
	"github.com/berth-ci/berth/services/crashpoint"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/sealing"
	"github.com/nats-io/nkeys"
)

// Minter mints a JIT runner configuration on GitHub for one attempt: the
// runner is named after the attempt and carries the pool's labels.
type Minter interface {
	Mint(ctx context.Context, a MintRequest) (runnerID int64, encodedJIT string, err error)
	// JobState reads one job from the REST API (the reconcile poll).
	JobState(ctx context.Context, owner, repo string, id int64) (JobState, error)
	// Deregister deletes a runner registration. It returns nil when the
	// runner is gone (deleted now, or a confirmed 404), ErrRunnerBusy when
	// GitHub says it is running a job.
	Deregister(ctx context.Context, runnerID int64, org, repo string) error
}

// ErrRunnerBusy: GitHub refused to delete a runner that is running a job
// (422 "Runner ... is still running a job").
var ErrRunnerBusy = errors.New("runner is running a job")

// MintRequest is what a JIT config is minted for.
type MintRequest struct {
	RunnerName string
	Pool       string
	Labels     []string
	Org, Repo  string // the job's repository, for repo-scoped runners
}

// DefaultMintConcurrency is how many JIT-config calls may be in flight
// at once by default.
const DefaultMintConcurrency = 4

// UnmintedPerCall sets the default Params.MaxUnminted: this many bookings
// per pool wait for each JIT-config call in flight (64 at the default 4).
const UnmintedPerCall = 16

// Options configure a Dispatcher.
type Options struct {
	Params      Params
	MintTimeout time.Duration
	// MintConcurrency bounds the JIT-config calls in flight; 0 means
	// DefaultMintConcurrency. A booking whose mint finds every place taken
	// waits for a later round. GitHub asks for mutating calls one at a
	// time ("Best practices for using the REST API"); unbounded, 10,000
	// bookings at once sent 10,000 calls together, they timed out, and
	// every retry met 409 for the name the lost answer had registered
	// (the bench's 500-host scale run).
	MintConcurrency int
	// Retention bounds how long terminal jobs and attempts stay in the
	// fold (law 5); 0 means 72 h.
	Retention time.Duration
	// Budget, when set, holds bookings and mints back while GitHub says to
	// wait: jobs stay demand and are served after the reset (BL-37).
	Budget *Budget
	// Reconcile, when Every > 0, polls GitHub for jobs whose webhooks went
	// missing.
	Reconcile Reconcile
	// Redeliverer, when set (and Reconcile.Every > 0), makes each reconcile
	// round also ask GitHub to redeliver failed workflow_job deliveries the
	// log does not hold (config: dispatcher.reconcile_redeliver).
	Redeliverer Redeliverer
	// Sweep, when Every > 0 (and the Minter is a RunnerLister), deletes
	// Berth-named runners no live attempt accounts for (sweep.go), listing
	// the runners of SweepOrg, or of every owner (SweepScope "org") or
	// repository ("repo") the fold names.
	Sweep                Sweep
	SweepScope, SweepOrg string
	// CurveSeedFile keeps the curve key placements are sealed by, so the
	// key the admin trusts (berth_trust) survives a restart; "" makes a
	// fresh key each start (tests).
	CurveSeedFile string
	// ScaleSetJob, when set, reports from the fold whether a job with
	// these labels is served through a runner scale set: the reconcile
	// poll's search for queued jobs leaves those to the scale set intake,
	// since GitHub assigns them within the capacity the intake advertises
	// and a job still queued there is not ours yet. It reads the fold (a
	// pool's labels are its hosts'), never what a replica learnt since it
	// started: two replicas, or one before and after a restart, decide
	// alike.
	ScaleSetJob func(f *events.Fleet, labels []string) bool
	// Installations are the GitHub installations beyond the default one
	// (whose calls go through the Minter, Budget and Sweep scope above).
	Installations []Installation
	Now           func() time.Time
	Logger        *slog.Logger
}

// Dispatcher is the act shell around Decide: the embedded eventlog.Shell
// folds the log and appends the plan; the dispatcher adds the calls only it
// makes (JIT configs, deregistrations, reconcile reads), each off the loop.
type Dispatcher struct {
	*eventlog.Shell
	minter   Minter
	gh       []Installation // the default installation first (installs)
	opts     Options
	curve    nkeys.KeyPair
	curvePub string
	metrics  *Metrics

	minting chan struct{} // one token per JIT-config call in flight
	minted  sync.Map      // attempt id → mintedPlacement, until the fold shows it
	// refused: attempts whose JIT config GitHub refused → release reason,
	// until the fold shows the slot released (Params.Refused).
	refused      map[string]string
	lastCompact  time.Time
	warnedUntil  map[string]time.Time // installation → the pause last warned of
	lastObserve  time.Time
	started      time.Time // facts older than this are not observed as latencies
	lastRecon    time.Time
	redelivered  map[string]time.Time // delivery GUIDs asked for again → when
	redelivering bool                 // a redelivery round is running
	sweeps       sweepState
	wg           sync.WaitGroup
}

// New builds a dispatcher. Its curve key seals JIT configs to agents.
func New(loop *eventlog.Loop, app *eventlog.Appender, m Minter, opts Options, metrics *Metrics) (*Dispatcher, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MintTimeout == 0 {
		opts.MintTimeout = 10 * time.Second
	}
	if opts.MintConcurrency <= 0 {
		opts.MintConcurrency = DefaultMintConcurrency
	}
	if opts.Params.MaxUnminted == 0 {
		// Enough bookings queued to keep every call busy, few enough that
		// each is minted well inside the provisioning deadline.
		opts.Params.MaxUnminted = UnmintedPerCall * opts.MintConcurrency
	}
	if opts.Params.MaxAttempts == 0 {
		opts.Params.MaxAttempts = DefaultMaxAttempts
	}
	if opts.Retention == 0 {
		opts.Retention = 72 * time.Hour
	}
	kp, err := sealing.LoadKey(opts.CurveSeedFile)
	if err != nil {
		return nil, err
	}
	pub, _ := kp.PublicKey()
	d := &Dispatcher{Shell: eventlog.NewShell(loop, app, clock.WithNow(opts.Now), opts.Logger),
		minter: m, gh: append([]Installation{{Minter: m, Budget: opts.Budget, SweepScope: opts.SweepScope, SweepOrg: opts.SweepOrg}},
			opts.Installations...), opts: opts, curve: kp, curvePub: pub, metrics: metrics, refused: map[string]string{}, warnedUntil: map[string]time.Time{},
		minting:     make(chan struct{}, opts.MintConcurrency),
		redelivered: map[string]time.Time{}, started: opts.Now()}
	// Only the agent that creates a VM opens its sealed JIT config: this
	// fold need not keep one for each running job (events.DropSealedJIT).
	d.Fold.DropSealedJIT()
	d.Crash = map[string][2]string{
		events.TypeSlotReleased: {crashpoint.DispatcherBeforeRelease, crashpoint.DispatcherAfterRelease},
		events.TypeSlotReserved: {"", crashpoint.DispatcherAfterReserve},
	}
	d.Skipped = metrics.skipped
	d.BeforeFold = d.observeLatency
	d.Stored = func(st events.Step) {
		if _, ok := st.Fact.(events.JobConflict); ok {
			metrics.conflicts.Inc()
		}
	}
	return d, nil
}

// Run drives the dispatcher until ctx ends, then waits for its mints.
func (d *Dispatcher) Run(ctx context.Context) error {
	defer d.wg.Wait()
	return d.Loop.Run(ctx, d)
}

// observeLatency feeds the queue-time and time-to-runner-online histograms
// from a fact about to be folded, the first time it moves its job or
// attempt. Facts older than this dispatcher's start are not observed, so a
// restart's replay counts nothing twice.
func (d *Dispatcher) observeLatency(e events.Event) {
	if e.Time.Before(d.started) {
		return
	}
	switch v := e.Data.(type) {
	case *events.JobInProgress:
		j := d.Fold.Jobs[v.JobID]
		if j == nil || j.QueuedAt.IsZero() || j.Status >= events.StatusInProgress {
			return
		}
		pool := "unknown" // a runner that is not Berth's
		if a := d.Fold.Attempts[v.RunnerName]; a != nil {
			pool = a.Pool
		}
		d.metrics.queueSeconds.WithLabelValues(pool).Observe(e.Time.Sub(j.QueuedAt).Seconds())
	case *events.AttemptRunnerStarted:
		a := d.Fold.Attempts[v.Attempt]
		if a == nil || a.RunnerStarted {
			return
		}
		if j := d.Fold.Jobs[a.JobID]; j != nil && !j.QueuedAt.IsZero() {
			start := "cold"
			if a.Warm {
				start = "warm"
			}
			d.metrics.onlineSeconds.WithLabelValues(a.Pool, start).Observe(e.Time.Sub(j.QueuedAt).Seconds())
		}
	}
}

// Decide implements eventlog.Reactor: it asks the pure Decide for a plan
// and executes it; mints and deregistrations go off the loop.
func (d *Dispatcher) Decide(ctx context.Context) {
	now := d.opts.Now()
	params := d.opts.Params
	params.Now, params.Refused = now, d.refused
	d.pause(now, &params)
	d.forgetMinted()
	d.Execute(ctx, Decide(d.Fold, params).Steps(), d.call)
	d.reconcile(ctx, now)
	d.sweep(ctx, now)
	d.housekeep(now)
	// Gauges from a full status view once a second, not on every batch:
	// the view is O(fleet) and decisions must stay cheap.
	if now.Sub(d.lastObserve) >= time.Second {
		d.lastObserve = now
		d.metrics.observe(d.Fold, d.opts.Params.Warm, now)
		d.metrics.observeBudget(d.opts.Budget, now)
	}
}

// pause sets params.Blocked while GitHub says to wait, warning once per
// wait. A rate limit of the REST API leaves scale-set pools exempt: they
// mint through the actions service (a refusal of the App's own
// credentials stops them too).
//
// Each installation has its own budget: a pause holds only the pools of
// the installation that must wait.
func (d *Dispatcher) pause(now time.Time, params *Params) {
	waits := map[string]string{} // installation → its pause's reason
	for _, in := range d.installs() {
		blocked, until := in.blocked(now)
		if !blocked {
			continue
		}
		reason, _ := in.Budget.Paused(now)
		waits[in.Name] = reason
		d.warnPause(in.Name, reason, until)
	}
	if len(waits) == 0 {
		return
	}
	params.Blocked = true
	installs, labels := d.Fold.PoolInstallations(), d.Fold.PoolLabels()
	scaleSet := d.opts.ScaleSetJob
	params.Waits = func(pool string) bool { _, w := waits[installs[pool]]; return w }
	params.Exempt = func(pool string) bool {
		reason, waits := waits[installs[pool]]
		return !waits || (reason != "auth" && scaleSet != nil && scaleSet(d.Fold, labels[pool]))
	}
}

// warnPause says once per wait that an installation's calls pause.
func (d *Dispatcher) warnPause(installation, reason string, until time.Time) {
	if d.warnedUntil[installation].Equal(until) {
		return
	}
	d.warnedUntil[installation] = until
	why, which := "GitHub rate limit", ""
	if reason == "auth" {
		why = "GitHub refused the App's credentials"
	} else if d.opts.ScaleSetJob != nil {
		which = " for webhook pools (scale-set pools go on)"
	}
	if len(d.installs()) > 1 {
		which += " of installation " + strconv.Quote(installation)
	}
	d.opts.Logger.Warn(why+": no new bookings or JIT configs"+which+" until then; queued jobs wait as demand",
		"until", until.Format(time.RFC3339))
}

// call makes one of the plan's GitHub calls, for an attempt the fold still
// holds.
func (d *Dispatcher) call(ctx context.Context, c events.Call) {
	switch c := c.(type) {
	case MintCall:
		if a := d.Fold.Attempts[c.Attempt]; a != nil && a.Held() {
			d.mint(ctx, a)
		}
	case DeregisterCall:
		if a := d.Fold.Attempts[c.Attempt]; a != nil {
			d.deregister(ctx, a)
		}
	}
}

// housekeep keeps memory flat in jobs served (law 5): terminal records leave
// the fold after the retention, and in-flight marks expire. It runs once a
// minute, or sooner while the fold grows fast (events.Fleet.CompactDue).
func (d *Dispatcher) housekeep(now time.Time) {
	if !d.Fold.CompactDue(now, d.lastCompact) {
		return
	}
	d.lastCompact = now
	d.Fold.Compact(now, d.opts.Retention)
	d.Housekeep()
	for id := range d.refused {
		if a := d.Fold.Attempts[id]; a == nil || !a.Held() {
			delete(d.refused, id)
		}
	}
	for guid, at := range d.redelivered {
		if now.Sub(at) >= redeliverAgainAfter {
			delete(d.redelivered, guid)
		}
	}
}

// rateLimited reports whether the default installation's calls wait.
func (d *Dispatcher) rateLimited(now time.Time) (bool, time.Time) {
	return d.installs()[0].blocked(now)
}

// mint asks GitHub for a JIT config off the loop, bounded by MintTimeout
// (law 3), seals it to the host's curve key and appends the placement. A
// refusal is recorded for Decide, which releases the slot so the job is
// booked again with a fresh attempt.
func (d *Dispatcher) mint(ctx context.Context, a *events.Attempt) {
	if _, ok := d.minted.Load(a.ID); ok {
		// GitHub answered already: never ask twice for one runner name (a
		// second call meets 409). The placement waits on the loop, or its
		// append failed and is tried again here.
		d.place(ctx, a.ID)
		return
	}
	key := MintCall{a.ID}.CallKey()
	if d.InFlight(key) {
		return
	}
	host := d.Fold.Hosts[a.Host]
	job := d.Fold.Jobs[a.JobID]
	if host == nil || host.CurveKey == "" || job == nil {
		return
	}
	in, ok := d.install(job.Installation)
	if !ok {
		return // its installation left the config: no client may mint for it
	}
	select {
	case d.minting <- struct{}{}:
	default:
		return // every call in flight: a later round mints it
	}
	d.MarkInFlight(key)
	req := MintRequest{RunnerName: a.ID, Pool: a.Pool, Labels: a.Labels, Org: job.Org, Repo: job.Repo}
	ref := events.AttemptRef{Attempt: a.ID, Pool: a.Pool, Host: a.Host}
	jobID, sealTo, warm, booked := a.JobID, host.CurveKey, a.Warm, a.BookedSeq
	logger := d.opts.Logger.With("attempt", a.ID, "pool", a.Pool, "host", a.Host, "job", a.JobID)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer func() { <-d.minting }()
		mctx, cancel := context.WithTimeout(ctx, d.opts.MintTimeout)
		defer cancel()
		start := time.Now()
		runnerID, jit, err := in.Minter.Mint(mctx, req)
		d.metrics.mintSeconds.Observe(time.Since(start).Seconds())
		if err != nil {
			d.mintFailed(ctx, ref.Attempt, warm, err, in.Budget, logger)
			return
		}
		crashpoint.Hit(crashpoint.DispatcherAfterMint)
		sealed, err := sealing.Seal(d.curve, sealTo, sealing.Placement{Attempt: ref.Attempt, Host: ref.Host, Pool: ref.Pool,
			JobID: jobID, BookedSeq: booked, JIT: []byte(jit)})
		if err != nil {
			logger.Error("sealing JIT config failed", "err", err)
			return
		}
		var placed events.Payload = events.AttemptPlaced{AttemptRef: ref, JobID: jobID, Labels: req.Labels, RunnerID: runnerID,
			SealedJIT: sealed, SealedBy: d.curvePub, SealedTo: sealTo}
		if warm { // a claimed warm VM: hand its JIT config to the VM that waits
			placed = events.AttemptAssigned{AttemptRef: ref, JobID: jobID, RunnerID: runnerID,
				SealedJIT: sealed, SealedBy: d.curvePub, SealedTo: sealTo}
		}
		// Place from the loop, against the fold as it is now: a slot
		// released while GitHub was answering gets no VM (law 1).
		d.minted.Store(ref.Attempt, mintedPlacement{fact: placed})
		d.Loop.Post(ctx, func() { d.place(ctx, ref.Attempt) })
	}()
}

// SealingKey is the curve public key placements are sealed by: what the
// admin trusts (`berth trust add`).
func (d *Dispatcher) SealingKey() string { return d.curvePub }

// mintFailed records, on the loop, what a refused mint means for Decide:
// a refusal for the job's repository or labels gives the slot back charged
// to the job (it is booked again with a fresh attempt); a rate limit, or a
// refusal of the App's own credentials, gives it back charged to GitHub,
// which costs the job nothing, and pauses calls (BL-12: hold no slot while
// GitHub says to wait; law 11); anything else leaves the booking for a
// retry, bounded by the provisioning deadline.
func (d *Dispatcher) mintFailed(ctx context.Context, attempt string, warm bool, err error, budget *Budget, logger *slog.Logger) {
	reason := events.ReleaseMintFailed
	switch {
	case RateLimited(err) && budget != nil:
		if warm {
			logger.Warn("GitHub rate limit on the JIT config; the claimed warm VM waits", "err", err)
			return
		}
		logger.Warn("GitHub rate limit on the JIT config; the slot goes back and the job waits as demand", "err", err)
		reason = events.ReleaseRateLimited
	case AuthRefused(err) && budget != nil:
		// GitHub's fault, not the job's (law 11): calls pause with a
		// back-off, the slot goes back charged to GitHub, and the job
		// stays demand, served when GitHub takes the credentials again.
		until := budget.Refused(time.Now())
		if warm {
			logger.Warn("GitHub refused the App's credentials on the JIT config; the claimed warm VM waits", "err", err, "until", until)
			return
		}
		logger.Error("GitHub refused the App's credentials on the JIT config; calls pause and the job waits as demand",
			"err", err, "until", until.Format(time.RFC3339))
		reason = events.ReleaseGitHubRefused
	case MintRetryable(err):
		logger.Warn("JIT config not minted yet; will retry", "err", err)
		return
	default:
		logger.Warn("JIT config refused; releasing the slot so the job is booked again", "err", err)
	}
	d.Loop.Post(ctx, func() { d.refused[attempt] = reason })
}

// mintedPlacement is a placement GitHub's answer produced, kept until the
// fold shows it: a runner name is minted once (a second call meets 409).
type mintedPlacement struct {
	fact   events.Payload // AttemptPlaced, or AttemptAssigned for a warm VM
	stored bool           // appended; the fold learns it from the consumer
}

// place appends the placement a mint produced, on the loop. A failed append
// is tried again by the next round instead of minting again.
func (d *Dispatcher) place(ctx context.Context, attempt string) {
	v, ok := d.minted.Load(attempt)
	if !ok || v.(mintedPlacement).stored {
		return
	}
	m := v.(mintedPlacement)
	_, warm := m.fact.(events.AttemptAssigned)
	a := d.Fold.Attempts[attempt]
	switch {
	case a == nil || !a.Held():
		d.minted.Delete(attempt)
		d.opts.Logger.Info("slot released while minting; not placing (GitHub drops the unused JIT runner after a day)", "attempt", attempt)
		return
	case (!warm && a.Placed) || (warm && a.Assigned):
		d.minted.Delete(attempt) // another replica's placement is stored
		return
	}
	logger := d.opts.Logger.With("attempt", a.ID, "pool", a.Pool, "host", a.Host, "job", a.JobID)
	if err := d.Append(ctx, m.fact); err != nil {
		logger.Warn("placement append failed; the next round appends it again", "err", err)
		return
	}
	d.minted.Store(attempt, mintedPlacement{fact: m.fact, stored: true})
	if warm {
		logger.Info("JIT config handed to a warm VM")
	} else {
		logger.Info("attempt placed")
	}
}

// forgetMinted drops minted placements the fold now shows, or whose slot
// is gone, every round: each holds a sealed runner credential, and the
// map holds only the mints in flight and the placements not yet folded
// (a few), so a finished job leaves nothing here.
func (d *Dispatcher) forgetMinted() {
	d.minted.Range(func(k, v any) bool {
		_, warm := v.(mintedPlacement).fact.(events.AttemptAssigned)
		if a := d.Fold.Attempts[k.(string)]; a == nil || !a.Held() || (!warm && a.Placed) || (warm && a.Assigned) {
			d.minted.Delete(k)
			// No round mints for it again: its mark need not wait
			// out InFlightFor in memory.
			d.Forget(MintCall{k.(string)}.CallKey())
		}
		return true
	})
}

// reconcile asks GitHub, off the loop and one call at a time, about jobs
// whose facts stopped coming, and appends what a lost webhook would have
// said. A delivery GitHub could not make (the dispatcher was down) is not
// retried by GitHub, so without this a completed job's slot would stay held.
func (d *Dispatcher) reconcile(ctx context.Context, now time.Time) {
	r := d.opts.Reconcile
	if r.Every <= 0 || now.Sub(d.lastRecon) < r.Every {
		return
	}
	d.lastRecon = now
	if blocked, _ := d.rateLimited(now); !blocked {
		d.redeliver(ctx, now)
	}
	candidates := ReconcileCandidates(d.Fold, now, r)
	for _, in := range d.installs() {
		if blocked, _ := in.blocked(now); !blocked {
			d.reconcileIn(ctx, in, candidates, r)
		}
	}
}

// reconcileIn starts one installation's reconcile round: its candidates
// read, its repositories searched for queued jobs, through its client.
func (d *Dispatcher) reconcileIn(ctx context.Context, in Installation, candidates []*events.Job, r Reconcile) {
	var jobs []events.Job // copies: the goroutine must not read the fold
	for _, j := range candidates {
		if j.Installation == in.Name {
			jobs = append(jobs, *j)
		}
	}
	lister, _ := in.Minter.(QueuedLister)
	var repos [][2]string
	if lister != nil {
		repos = ReconcileRepos(d.Fold, in.Name)
	}
	if len(jobs) == 0 && len(repos) == 0 {
		return
	}
	// One round at a time: a round's reads may outlast Every, and rounds
	// piling up would spend the API budget on the same jobs twice.
	round := "reconcile-round/" + in.Name
	if d.InFlight(round) {
		return
	}
	d.MarkInFlight(round)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer d.Loop.Post(ctx, func() { d.Forget(round) })
		defer d.findQueued(ctx, in, lister, repos, r.Limit)
		for _, j := range jobs {
			cctx, cancel := context.WithTimeout(ctx, d.opts.MintTimeout)
			s, err := in.Minter.JobState(cctx, j.Org, j.Repo, j.ID)
			cancel()
			if err != nil {
				d.opts.Logger.Debug("reconcile read failed; nothing changes on a failed read", "job", j.ID, "err", err)
				continue
			}
			if p := ReconcileFact(&j, s); p != nil {
				d.opts.Logger.Warn("a webhook went missing; the API says the job moved on", "job", j.ID, "status", s.Status)
				if _, err := d.Log.AppendConfirmed(ctx, d.Log.New(d.opts.Now(), p), nil); err != nil {
					d.opts.Logger.Warn("reconciled fact not stored; the next round retries", "job", j.ID, "err", err)
				}
			}
		}
	}()
}

// deregister deletes a surplus runner's registration off the loop, bounded
// by MintTimeout. GitHub's confirmation is appended as a fact, from which
// Decide releases the slot: a runner that already took a job is never torn
// down on the strength of a webhook that has not arrived (law 7), and a
// lost append is decided again.
func (d *Dispatcher) deregister(ctx context.Context, a *events.Attempt) {
	key := DeregisterCall{a.ID}.CallKey()
	if d.InFlight(key) {
		return
	}
	job := d.Fold.Jobs[a.JobID]
	if job == nil {
		return
	}
	in, ok := d.install(job.Installation)
	if !ok {
		return
	}
	d.MarkInFlight(key)
	ref := events.AttemptRef{Attempt: a.ID, Pool: a.Pool, Host: a.Host}
	runnerID, org, repo := a.RunnerID, job.Org, job.Repo
	logger := d.opts.Logger.With("attempt", a.ID, "pool", a.Pool, "host", a.Host)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		dctx, cancel := context.WithTimeout(ctx, d.opts.MintTimeout)
		defer cancel()
		err := in.Minter.Deregister(dctx, runnerID, org, repo)
		d.Loop.Post(ctx, func() {
			switch {
			case errors.Is(err, ErrRunnerBusy):
				// A fact, not this replica's memory: every replica and
				// the watchdog leave the runner alone (Params.busy). The
				// call stays in flight until the fact is folded.
				d.MarkInFlight(key)
				logger.Info("runner is running a job; leaving it (its in_progress webhook is on the way)")
				_ = d.Append(ctx, events.AttemptRunnerBusy{AttemptRef: ref, RunnerID: runnerID, At: d.Now()})
			case err != nil:
				d.Forget(key)
				logger.Warn("could not deregister a surplus runner; will retry", "err", err)
			default:
				// Still in flight until the fold shows the fact below: a
				// decision taken before that must not call DELETE again.
				d.MarkInFlight(key)
				logger.Info("runner deregistered; its slot is released from the fact")
				_ = d.Append(ctx, events.AttemptDeregistered{AttemptRef: ref, RunnerID: runnerID})
			}
		})
	}()
}

// Fleet exposes the fold for health and tests; call it only from the loop
// (e.g. inside Loop.Post).
func (d *Dispatcher) Fleet() *events.Fleet { return d.Fold }
