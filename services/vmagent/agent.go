// Package vmagent is the per-host agent: it advertises the host's pools and
// physical capacity, takes only its own placements, and runs every backend
// step off its loop with a deadline (law 3).
package vmagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/clock"
	"github.com/berth-ci/berth/services/crashpoint"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/sealing"
	"github.com/berth-ci/berth/services/trust"
	"github.com/berth-ci/berth/services/vmagent/backend"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// Options configure an Agent.
type Options struct {
	Host        string
	Pools       map[string]events.PoolSlots
	PhysicalCap int
	// Resources the host's VMs share, counted by their pools' shapes at
	// placement; nil: only PhysicalCap counts.
	Resources     *events.Resources
	DataDir       string // per-attempt work dirs and the curve key live here
	CreateTimeout time.Duration
	StopTimeout   time.Duration
	Heartbeat     time.Duration
	// HeartbeatReplicas replicates the heartbeat bucket like the log
	// (nats.replicas): on one replica, losing the NATS node that holds it
	// silences every host at once. 0 means 1.
	HeartbeatReplicas int
	// ShutdownTimeout is how long a drain (SIGTERM) lets running jobs
	// finish before their VMs are stopped; 0 stops at once without a drain.
	ShutdownTimeout time.Duration
	// InventoryEvery is how often the backend's real inventory is read
	// (also once at start); 0 means 1 min. OrphanGrace is how long a VM no
	// live attempt owns may stay before it is stopped; 0 means 2 min.
	InventoryEvery time.Duration
	OrphanGrace    time.Duration
	// RunnerPoll is how often the output of runners that took no job yet
	// is read for their version and GitHub's refusal of it (runners.go);
	// 0 means DefaultRunnerPoll.
	RunnerPoll time.Duration
	// RetryBase is the first wait before a failed or overrun stop is tried
	// again; it doubles up to 5 min. 0 means 5 s.
	RetryBase time.Duration
	// Trust says which dispatchers' keys this agent accepts placements
	// sealed by (berth_trust); nil accepts any sender (tests that seal with
	// a key of their own).
	Trust  *trust.Set
	Now    func() time.Time
	Logger *slog.Logger
}

// Agent is one host's vmagent.
type Agent struct {
	*eventlog.Shell
	js      jetstream.JetStream
	backend backend.Backend
	opts    Options
	curve   nkeys.KeyPair
	boot    string

	creating map[string]bool      // attempts whose create step is running
	stopping map[string]bool      // attempts whose stop step is running
	retryAt  map[string]time.Time // attempts whose stop failed or overran → when to try again
	fails    map[string]int       // … and how often it failed, for the back-off
	// draining: refuse new creates; forceStop: stop every live VM (drain timeout).
	draining, forceStop bool
	reannounced         time.Time
	hostLost            bool // the last host fact watchHost folded says this host is lost
	sweep               sweep
	runners             runnerWatch
	lastHK              time.Time
	wg                  sync.WaitGroup
}

// New builds an agent. The curve key that JIT configs are sealed to is kept
// in DataDir, so placements sealed before a restart can still be opened.
func New(js jetstream.JetStream, app *eventlog.Appender, b backend.Backend, opts Options) (*Agent, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	opts.Logger = opts.Logger.With("host", opts.Host)
	if bc := b.PhysicalCap(); bc > 0 && (opts.PhysicalCap <= 0 || opts.PhysicalCap > bc) {
		if opts.PhysicalCap > bc {
			opts.Logger.Warn("physical_cap is above the backend's own limit; advertising the backend's",
				"physical_cap", opts.PhysicalCap, "backend_cap", bc, "backend", b.Name())
		}
		opts.PhysicalCap = bc
	}
	attempts := filepath.Join(opts.DataDir, "attempts")
	if _, inMemory := backend.As[backend.InMemoryJIT](b); inMemory {
		// Nothing of this backend's attempts is kept on disk: what is there
		// is JIT configs an earlier build wrote to files (ec2 before it
		// took them in memory), credentials no stop would remove.
		if err := os.RemoveAll(attempts); err != nil {
			opts.Logger.Warn("JIT config files an earlier build left could not be removed; remove them", "dir", attempts, "err", err)
		}
	}
	if err := os.MkdirAll(attempts, 0o700); err != nil {
		return nil, fmt.Errorf("agent data dir: %w", err)
	}
	kp, err := sealing.LoadKey(filepath.Join(opts.DataDir, "curve.seed"))
	if err != nil {
		return nil, err
	}
	// One filter: the server sees it in the consumer's create subject, so
	// NATS permissions can confine an agent to its own host's placements
	// (deploy/nats/README.md). The host's own facts are watched apart
	// (watchHost).
	loop := &eventlog.Loop{JS: js, Filters: []string{events.HostAttemptsFilter(opts.Host)},
		SnapshotKey: events.SnapshotKeyAgent(opts.Host)}
	a := &Agent{Shell: eventlog.NewShell(loop, app, clock.WithNow(opts.Now), opts.Logger), js: js, backend: b, opts: opts, curve: kp,
		boot:     strconv.FormatInt(time.Now().UnixNano(), 36),
		creating: map[string]bool{}, stopping: map[string]bool{}, retryAt: map[string]time.Time{}, fails: map[string]int{}}
	// A create or stop reported to the log must not be started again
	// while its fact is on its way back, even on a slow consumer.
	a.InFlightFor = time.Minute
	a.Crash = map[string][2]string{events.TypeAttemptProvisioning: {"", crashpoint.AgentAfterProvisioning}}
	return a, nil
}

// Run advertises the host, heartbeats, and drives the agent until ctx ends.
// On return every backend step it started has returned or been abandoned.
func (a *Agent) Run(ctx context.Context) error {
	defer a.wg.Wait()
	// Runs before wg.Wait: a loop that fails also ends the heartbeat.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := a.announce(ctx); err != nil {
		return fmt.Errorf("announce host %s: %w", a.opts.Host, err)
	}
	kv, err := eventlog.HeartbeatKV(ctx, a.js, a.opts.HeartbeatReplicas, a.opts.Logger)
	if err != nil {
		return err
	}
	a.opts.Logger.Info("agent online", "pools", len(a.opts.Pools), "physical_cap", a.opts.PhysicalCap, "backend", a.backend.Name())
	if a.opts.ShutdownTimeout <= 0 {
		a.wg.Add(2)
		go a.heartbeat(ctx, kv)
		go a.watchHost(ctx)
		return a.Loop.Run(ctx, a)
	}
	// With a drain, the loop and the heartbeat outlive ctx (the SIGTERM) until
	// the drain is over.
	life, endLife := context.WithCancel(context.WithoutCancel(ctx))
	defer endLife()
	a.wg.Add(2)
	go a.heartbeat(life, kv)
	go a.watchHost(life)
	loopErr := make(chan error, 1)
	go func() { loopErr <- a.Loop.Run(life, a) }()
	select {
	case err := <-loopErr:
		return err
	case <-ctx.Done():
	}
	a.drain(life)
	endLife()
	return <-loopErr
}

// watchHost follows this host's own facts (online, lost, draining,
// cordons) through its own consumer on the host's subject alone
// (events.HostWatchConsumer: the only other name its permissions grant), folds
// them, and tells the loop whether the host is recorded lost. It retries
// until ctx ends.
func (a *Agent) watchHost(ctx context.Context) {
	defer a.wg.Done()
	subject := events.HostFilter(a.opts.Host)
	f := events.NewFleet()
	for ctx.Err() == nil {
		ch := make(chan eventlog.Delivered, 64)
		fctx, stop := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() {
			errc <- eventlog.Follow(fctx, a.js, events.HostWatchConsumer(a.opts.Host), []string{subject}, f.LastSeq+1, ch)
		}()
	read:
		for {
			select {
			case err := <-errc:
				if ctx.Err() == nil {
					a.opts.Logger.Warn("cannot follow this host's facts yet; retrying", "subject", subject, "err", err)
				}
				break read
			case d := <-ch:
				if d.Err == nil {
					_, d.Err = events.Authorize(d.Event) // a forged "host lost" must not make it re-announce
				}
				if d.Err != nil {
					f.Skip(d.Event.Seq, d.Event.Subject)
					continue
				}
				f.Apply(d.Event)
				lost := false
				if h := f.Hosts[a.opts.Host]; h != nil {
					lost = h.State == events.HostStateLost
				}
				a.Loop.Post(ctx, func() { a.hostLost = lost })
			}
		}
		stop()
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// announce appends the host's online fact: at start, and again whenever
// the agent, alive, sees its host reported lost (a pause or a partition
// longer than the heartbeat TTL), so the host comes back without a restart.
func (a *Agent) announce(ctx context.Context) error {
	pub, _ := a.curve.PublicKey()
	now := a.opts.Now()
	online := events.HostOnline{Host: a.opts.Host, Boot: a.boot, Pools: a.opts.Pools,
		PhysicalCap: a.opts.PhysicalCap, Resources: a.opts.Resources, CurveKey: pub, Backend: a.backend.Name(), Assign: a.backend.CanAssign(), At: now.UTC()}
	_, err := a.Log.AppendConfirmed(ctx, a.Log.New(now, online), nil)
	return err
}

func (a *Agent) heartbeat(ctx context.Context, kv jetstream.KeyValue) {
	defer a.wg.Done()
	every := a.opts.Heartbeat
	if every == 0 {
		every = 5 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		// Every Put is a new revision of the host's key: that change is what
		// the watchdog watches, on its own clock. At, on this host's clock, is
		// for display and the skew report only.
		hb, _ := json.Marshal(events.Heartbeat{Host: a.opts.Host, Boot: a.boot, At: a.opts.Now().UTC()})
		pctx, cancel := context.WithTimeout(ctx, every)
		if _, err := kv.Put(pctx, a.opts.Host, hb); err != nil && ctx.Err() == nil {
			a.opts.Logger.Warn("heartbeat not stored", "err", err)
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Decide implements eventlog.Reactor: it asks the pure Decide for a plan,
// executes it (backend steps off the loop), and keeps the host's inventory
// and memory in order.
func (a *Agent) Decide(ctx context.Context) {
	now := a.Now()
	l := Local{Host: a.opts.Host, Now: now, Draining: a.draining, ForceStop: a.forceStop, HostLost: a.hostLost,
		Reannounced: a.reannounced, Creating: a.creating, Stopping: a.stopping, RetryAt: a.retryAt, InFlight: a.InFlight}
	a.Execute(ctx, Decide(a.Fold, l), a.call)
	a.inventory(ctx, now)
	a.watchRunners(ctx, now)
	a.housekeep(now)
}

// call starts one of the plan's backend steps for an attempt the fold holds.
func (a *Agent) call(ctx context.Context, c events.Call) {
	var at *events.Attempt
	switch c := c.(type) {
	case CreateCall:
		if at = a.Fold.Attempts[c.Attempt]; at != nil {
			a.startCreate(ctx, at)
		}
	case AssignCall:
		if at = a.Fold.Attempts[c.Attempt]; at != nil {
			a.startAssign(ctx, at)
		}
	case StopCall:
		if at = a.Fold.Attempts[c.Attempt]; at != nil {
			a.startStop(ctx, at)
		}
	case AnnounceCall:
		a.reannounced = a.Now()
		a.opts.Logger.Warn("this host was reported lost while the agent runs; announcing it online again")
		if err := a.announce(ctx); err != nil {
			a.opts.Logger.Warn("re-announce failed; will retry", "err", err)
		}
	}
}

// housekeep keeps the agent's memory flat in jobs served (law 5), once a
// minute or sooner while the fold grows fast (events.Fleet.CompactDue).
func (a *Agent) housekeep(now time.Time) {
	if !a.Fold.CompactDue(now, a.lastHK) {
		return
	}
	a.lastHK = now
	a.Fold.Compact(now, 10*time.Minute)
	a.Housekeep()
	for id := range a.retryAt {
		if at := a.Fold.Attempts[id]; at == nil || at.Stopped {
			delete(a.retryAt, id)
			delete(a.fails, id)
		}
	}
}

// backOff paces the stops of one attempt after a failure or an overrun:
// RetryBase, doubling, up to 5 min. It returns the wait.
func (a *Agent) backOff(id string) time.Duration {
	base := a.opts.RetryBase
	if base <= 0 {
		base = 5 * time.Second
	}
	wait := min(base<<min(a.fails[id], 6), 5*time.Minute)
	a.fails[id]++
	a.retryAt[id] = a.Now().Add(wait)
	return wait
}

func (a *Agent) vm(at *events.Attempt) backend.VM {
	vm := backend.VM{Attempt: at.ID, Pool: at.Pool, Host: at.Host, Labels: at.Labels, JobID: at.JobID,
		Shape: a.opts.Pools[at.Pool].Shape}
	if !a.inMemoryJIT() {
		vm.WorkDir = filepath.Join(a.opts.DataDir, "attempts", at.ID)
		vm.JITConfigFile = filepath.Join(vm.WorkDir, "jitconfig")
	}
	return vm
}

// inMemoryJIT: the backend takes the JIT config in memory and the agent
// keeps no directory for its attempts (backend.InMemoryJIT).
func (a *Agent) inMemoryJIT() bool {
	_, ok := backend.As[backend.InMemoryJIT](a.backend)
	return ok
}

// handOver puts an opened JIT config where the backend reads it: in vm
// for an InMemoryJIT backend, else in the attempt's file (mode 0600) in
// its own directory.
func (a *Agent) handOver(vm *backend.VM, jit []byte) error {
	if a.inMemoryJIT() {
		vm.JITConfig = jit
		return nil
	}
	return writeJIT(*vm, jit)
}

// clearWorkDir removes what the agent kept of an attempt on disk (its
// directory, with its JIT config); an InMemoryJIT backend's kept nothing.
func clearWorkDir(vm backend.VM) {
	if vm.WorkDir != "" {
		_ = os.RemoveAll(vm.WorkDir)
	}
}

// outcome is the fact a create or assign step's result calls for: success
// when it returned nil; abandoned when it overran its deadline (law 3);
// failed otherwise. ok is false when the agent is shutting down (the
// watchdog's deadline covers the attempt then).
func (a *Agent) outcome(ctx context.Context, r events.AttemptRef, step string, err error, success events.Payload, logger *slog.Logger) (events.Payload, bool) {
	switch {
	case ctx.Err() != nil:
		return nil, false
	case errors.Is(err, context.DeadlineExceeded):
		logger.Warn(step+" overran its deadline; abandoned", "after", a.opts.CreateTimeout)
		return events.AttemptAbandoned{AttemptRef: r, Step: step, After: a.opts.CreateTimeout}, true
	case err != nil:
		logger.Warn(step+" failed", "err", err)
		return events.AttemptFailed{AttemptRef: r, Step: step, Error: err.Error(), Culprit: backend.Culprit(err)}, true
	}
	logger.Info(step+" done", "result", success.EventType())
	return success, true
}

// startAssign hands a claimed warm VM its JIT config: opens the sealed
// config, writes its file, and runs the backend's assign step off the loop
// under the create deadline (law 3). The runner has started when it returns.
func (a *Agent) startAssign(ctx context.Context, at *events.Attempt) {
	r := ref(at)
	vm, sealed, sealedBy, want := a.vm(at), at.SealedJIT, at.SealedBy, *at // copies: the goroutine must not read the fold
	vm.Warm = true
	a.creating[at.ID] = true
	logger := a.opts.Logger.With("attempt", at.ID, "pool", at.Pool, "job", at.JobID)
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		start := time.Now()
		jit, err := a.open(ctx, want, sealed, sealedBy)
		if err == nil {
			err = a.handOver(&vm, jit)
		}
		var result events.Payload
		if err != nil {
			result = events.AttemptFailed{AttemptRef: r, Step: "open_jit", Error: err.Error(), Culprit: events.CulpritBerth}
		} else {
			err = a.step(ctx, a.opts.CreateTimeout, func(c context.Context) error { return a.backend.Assign(c, vm) })
			var ok bool
			if result, ok = a.outcome(ctx, r, "assign", err, events.AttemptRunnerStarted{AttemptRef: r, Took: time.Since(start)}, logger); !ok {
				return
			}
		}
		a.Loop.Post(ctx, func() {
			delete(a.creating, r.Attempt)
			_ = a.Append(ctx, result)
		})
	}()
}

// startCreate records "provisioning" before calling the backend, so a
// restarted agent never creates the same attempt twice, then runs create off
// the loop under its deadline.
func (a *Agent) startCreate(ctx context.Context, at *events.Attempt) {
	r := ref(at)
	if err := a.Append(ctx, events.AttemptProvisioning{AttemptRef: r}); err != nil {
		return
	}
	vm, sealed, sealedBy, warm, want := a.vm(at), at.SealedJIT, at.SealedBy, at.Warm, *at // copies: the goroutine must not read the fold
	if warm {
		vm.Warm, vm.JITConfigFile = true, "" // booted now, handed its JIT config when a job claims it
	}
	a.creating[at.ID] = true
	logger := a.opts.Logger.With("attempt", at.ID, "pool", at.Pool, "job", at.JobID)
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		// Opening the sealed config and writing its file are off the loop
		// too: a slow or full disk must not hold every other attempt.
		var err error
		if warm { // its work dir now, its JIT config on assign
			if vm.WorkDir != "" {
				err = makeWorkDir(vm.WorkDir)
			}
		} else {
			var jit []byte
			if jit, err = a.open(ctx, want, sealed, sealedBy); err == nil {
				err = a.handOver(&vm, jit)
			}
		}
		if err != nil {
			a.Loop.Post(ctx, func() {
				delete(a.creating, r.Attempt)
				_ = a.Append(ctx, events.AttemptFailed{AttemptRef: r, Step: "open_jit", Error: err.Error(), Culprit: events.CulpritBerth})
			})
			return
		}
		start := time.Now()
		err = a.step(ctx, a.opts.CreateTimeout, func(c context.Context) error { return a.backend.Create(c, vm) })
		crashpoint.Hit(crashpoint.AgentAfterCreate)
		var success events.Payload = events.AttemptRunnerStarted{AttemptRef: r, Took: time.Since(start)}
		if warm {
			success = events.AttemptReady{AttemptRef: r}
		}
		result, ok := a.outcome(ctx, r, "create", err, success, logger)
		if !ok {
			return
		}
		a.Loop.Post(ctx, func() {
			delete(a.creating, r.Attempt)
			_ = a.Append(ctx, result)
		})
	}()
}

// startStop runs the stop step off the loop under its deadline. Overrunning
// it abandons the VM, which keeps occupying physical capacity (law 3); the
// stop is then retried with back-off, never queued behind the wedged call,
// and a late return of any of them records the VM stopped (late).
func (a *Agent) startStop(ctx context.Context, at *events.Attempt) {
	a.stopping[at.ID] = true
	r, vm, abandoned := ref(at), a.vm(at), at.Abandoned
	logger := a.opts.Logger.With("attempt", at.ID, "pool", at.Pool)
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		crashpoint.Hit(crashpoint.AgentBeforeStop)
		// How the stop ended comes through a channel: a stop that overruns
		// its deadline still returns later, on its own goroutine.
		endedc := make(chan string, 1)
		err, late := a.stepLate(ctx, a.opts.StopTimeout, func(c context.Context) error {
			e, err := backend.StopEnded(c, a.backend, vm)
			endedc <- e
			return err
		})
		var ended string
		if err == nil { // read only what a stop that returned in time said
			select {
			case ended = <-endedc:
			default:
			}
		}
		if late != nil {
			go a.awaitLateStop(ctx, r, vm, late, logger)
		}
		if err == nil {
			clearWorkDir(vm) // here, not on the loop
		}
		crashpoint.Hit(crashpoint.AgentAfterStop)
		a.Loop.Post(ctx, func() {
			delete(a.stopping, r.Attempt)
			switch {
			case ctx.Err() != nil:
			case errors.Is(err, context.DeadlineExceeded):
				wait := a.backOff(r.Attempt)
				if !abandoned {
					logger.Warn("stop overran its deadline; VM abandoned, it still counts against physical capacity",
						"after", a.opts.StopTimeout, "retry_in", wait)
					_ = a.Append(ctx, events.AttemptAbandoned{AttemptRef: r, Step: "stop", After: a.opts.StopTimeout})
				}
			case err != nil:
				logger.Warn("stop failed; will retry", "err", err, "retry_in", a.backOff(r.Attempt))
			default:
				logger.Info("VM stopped", "late", abandoned, "ended", ended)
				_ = a.Append(ctx, events.AttemptStopped{AttemptRef: r, Late: abandoned, Ended: ended})
			}
		})
	}()
}

// awaitLateStop waits for a stop call that ignored its deadline; if it
// eventually succeeds, the VM is recorded stopped (late), which discharges
// it from the host's abandoned count.
func (a *Agent) awaitLateStop(ctx context.Context, r events.AttemptRef, vm backend.VM, late <-chan error, logger *slog.Logger) {
	select {
	case <-ctx.Done():
	case err := <-late:
		if err != nil {
			return
		}
		logger.Info("a stop returned after its deadline: VM stopped late")
		clearWorkDir(vm)
		a.Loop.Post(ctx, func() {
			_ = a.Append(ctx, events.AttemptStopped{AttemptRef: r, Late: true})
		})
	}
}

// stepLate is step that also hands back, when fn outlived its deadline, a
// channel that delivers fn's eventual result.
func (a *Agent) stepLate(ctx context.Context, timeout time.Duration, fn func(context.Context) error) (error, <-chan error) {
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- fn(sctx) }()
	select {
	case err := <-done:
		if err != nil && sctx.Err() != nil {
			return sctx.Err(), nil
		}
		return err, nil
	case <-sctx.Done():
		return sctx.Err(), done
	}
}

// step runs fn with a deadline. If fn ignores its context and does not
// return, step returns at the deadline anyway and leaves fn behind: the loop
// is never held hostage by a backend.
func (a *Agent) step(ctx context.Context, timeout time.Duration, fn func(context.Context) error) error {
	err, _ := a.stepLate(ctx, timeout, fn)
	return err
}

// open opens a placement's sealed JIT config only when a trusted
// dispatcher sealed it for this very attempt and booking (law 10); a
// refusal says why, and becomes the attempt's failure.
func (a *Agent) open(ctx context.Context, at events.Attempt, sealed []byte, by string) ([]byte, error) {
	var trusted func(string) (bool, error)
	if a.opts.Trust != nil {
		trusted = func(pub string) (bool, error) { return a.trusted(ctx, pub) }
	}
	jit, err := sealing.Open(a.curve, sealed, by, trusted,
		sealing.Placement{Attempt: at.ID, Host: at.Host, Pool: at.Pool, JobID: at.JobID})
	if err != nil {
		a.opts.Logger.Error("placement refused: not opened, no VM started", "attempt", at.ID, "job", at.JobID, "err", err)
	}
	return jit, err
}

// trusted asks the trust bucket about a sealing key, again for up to the
// create deadline while the bucket does not answer: not knowing is no
// refusal (law 7).
func (a *Agent) trusted(ctx context.Context, pub string) (bool, error) {
	deadline := time.Now().Add(a.opts.CreateTimeout)
	for {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ok, err := a.opts.Trust.Dispatcher(tctx, pub)
		cancel()
		if !errors.Is(err, trust.ErrUnreadable) || time.Now().After(deadline) || ctx.Err() != nil {
			return ok, err
		}
		a.opts.Logger.Warn("trust bucket unreadable; asking again", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func writeJIT(vm backend.VM, jit []byte) error {
	if err := makeWorkDir(vm.WorkDir); err != nil {
		return err
	}
	return os.WriteFile(vm.JITConfigFile, jit, 0o600)
}

// makeWorkDir makes an attempt's own directory with one mkdir where its
// parent exists, as it does after the first (MkdirAll looks at each
// parent first: three calls into a kernel where each costs, for every
// VM); a directory there already (a restarted create) is kept.
func makeWorkDir(dir string) error {
	err := os.Mkdir(dir, 0o700)
	switch {
	case err == nil, errors.Is(err, fs.ErrExist):
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return os.MkdirAll(dir, 0o700)
	}
	return err
}
