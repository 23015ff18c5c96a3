// Package run wires Berth's services from a config: each service on its own
// NATS connection, as if it were its own process, and `berth dev`, which
// runs them all around an embedded nats-server.
package run

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/dispatch"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/httpx"
	"github.com/berth-ci/berth/services/natsauth"
	"github.com/berth-ci/berth/services/natsembed"
	"github.com/berth-ci/berth/services/trust"
	"github.com/berth-ci/berth/services/vmagent"
	"github.com/berth-ci/berth/services/vmagent/backend"
	"github.com/berth-ci/berth/services/watchdog"
	"github.com/google/go-github/v62/github"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// System is a running set of services.
type System struct {
	NATSURL        string
	DispatcherAddr string
	// PageAddr is the operator's page (host:port), "" when it is off.
	PageAddr     string
	WatchdogAddr string
	AgentAddrs   map[string]string
	Dispatcher   *dispatch.Dispatcher
	Watchdog     *watchdog.Watchdog
	// Agents are the agents this process runs, by host (benchmarks read
	// their folds).
	Agents map[string]*vmagent.Agent

	server   *server.Server
	wg       sync.WaitGroup
	mu       sync.Mutex
	errs     []error
	failed   chan struct{}
	failOnce sync.Once
	running  map[string]int // goRun names still running, for Running
}

// Failed is closed when any service stops with an error: a process running
// services exits then rather than serving a dead loop's health.
func (s *System) Failed() <-chan struct{} { return s.failed }

func (s *System) fail(name string, err error) {
	if err == nil || errors.Is(err, context.Canceled) {
		return
	}
	s.mu.Lock()
	s.errs = append(s.errs, fmt.Errorf("%s: %w", name, err))
	s.mu.Unlock()
	s.failOnce.Do(func() { close(s.failed) })
}

// Wait blocks until every service has stopped (cancel the context given to
// Start), shuts the embedded server down, and returns the services' errors.
func (s *System) Wait() error {
	s.wg.Wait()
	if s.server != nil {
		s.server.Shutdown()
		s.server.WaitForShutdown()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(s.errs...)
}

func (s *System) goRun(name string, fn func() error) {
	s.wg.Add(1)
	s.mu.Lock()
	s.running[name]++
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		defer func() {
			s.mu.Lock()
			if s.running[name]--; s.running[name] <= 0 {
				delete(s.running, name)
			}
			s.mu.Unlock()
		}()
		s.fail(name, fn())
	}()
}

// Running names the parts still running ("dispatcher", "agent host-a",
// "watchdog http"…), sorted: what a stopping process is waiting for.
func (s *System) Running() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.running))
	for name := range s.running {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// Dev starts the whole system: an embedded nats-server (unless cfg.NATS.URL
// names one), the stream, the dispatcher, the watchdog and every configured
// agent. It returns once every HTTP endpoint is listening.
func Dev(ctx context.Context, cfg *config.Config, logger *slog.Logger) (*System, error) {
	s := NewSystem()
	s.NATSURL = cfg.NATS.URL
	if s.NATSURL == "" {
		srv, err := natsembed.StartEmbedded(natsembed.EmbeddedConfig{Listen: cfg.NATS.Listen,
			StoreDir: filepath.Join(cfg.DataDir, "nats")})
		if err != nil {
			return nil, err
		}
		s.server, s.NATSURL = srv, srv.ClientURL()
		logger.Info("embedded nats-server started", "url", s.NATSURL, "store", filepath.Join(cfg.DataDir, "nats"))
	}
	cfg.NATS.URL = s.NATSURL
	if err := ensure(ctx, cfg); err != nil {
		s.shutdownServer()
		return nil, err
	}
	var err error
	if s.Dispatcher, s.DispatcherAddr, err = Dispatcher(ctx, s, cfg, logger); err != nil {
		return nil, s.abort(err)
	}
	if s.Watchdog, s.WatchdogAddr, err = Watchdog(ctx, s, cfg, logger); err != nil {
		return nil, s.abort(err)
	}
	for _, a := range cfg.Agents {
		addr, err := Agent(ctx, s, cfg, a, logger)
		if err != nil {
			return nil, s.abort(err)
		}
		s.AgentAddrs[a.Host] = addr
	}
	return s, nil
}

func (s *System) shutdownServer() {
	if s.server != nil {
		s.server.Shutdown()
		s.server.WaitForShutdown()
	}
}

// abort is for a failed start: the caller cancels ctx; we wait for what did
// start, then report.
func (s *System) abort(err error) error {
	return fmt.Errorf("start: %w (cancel the context to stop what started)", err)
}

// NewSystem returns an empty system for running single services.
func NewSystem() *System {
	return &System{AgentAddrs: map[string]string{}, failed: make(chan struct{}), running: map[string]int{}}
}

// ensure is `berth dev`'s admin step: it applies the stream and the
// buckets on the embedded server, as `berth stream apply` does elsewhere,
// and grants its own agents what they announce (`--grant-agents`), or
// they would be offered nothing.
func ensure(ctx context.Context, cfg *config.Config) error {
	nc, js, err := eventlog.Connect(cfg.NATS.URL, "berth-setup")
	if err != nil {
		return err
	}
	defer nc.Close()
	if _, err = eventlog.Apply(ctx, js, streamConfig(cfg)); err != nil {
		return err
	}
	_, err = GrantAgents(ctx, js, cfg.Agents, "berth dev")
	return err
}

// connect dials NATS for one service (role: its NATS role, whose inbox
// prefix it uses) and waits for the stream, which it never changes.
func connect(ctx context.Context, cfg *config.Config, name, role string) (*nats.Conn, jetstream.JetStream, *streamHealth, error) {
	opts, err := authOptions(cfg.NATS.CredsFile, cfg.NATS.NKeyFile)
	if err != nil {
		return nil, nil, nil, err
	}
	opts = append(opts, nats.CustomInboxPrefix(natsauth.InboxPrefix(role)), eventlog.WaitForServer)
	nc, js, err := eventlog.Connect(cfg.NATS.URL, name, opts...)
	if err != nil {
		return nil, nil, nil, err
	}
	verify := verifier(js, cfg, role)
	drift, err := awaitStream(ctx, cfg, js, name, verify)
	if err != nil {
		reached := nc.IsConnected()
		nc.Close()
		return nil, nil, nil, streamWaitError(err, reached, cfg.NATS.URL, ctx.Err() != nil)
	}
	return nc, js, newStreamHealth(verify, drift, presenceOnly(role)), nil
}

// streamWaitError says why a starting service has no stream, and what to
// do: a server never reached is not a JetStream problem, and a service
// stopped while it waited did not wait streamWait.
func streamWaitError(err error, reached bool, url string, stopped bool) error {
	switch {
	case !reached:
		return fmt.Errorf("NATS at %s is not reachable (%w): is nats-server running there, and does nats.url (or --nats) name it?", url, err)
	case stopped:
		return fmt.Errorf("stopped while waiting for the stream %s: %w", events.StreamName, err)
	}
	return fmt.Errorf("%w (waited %s: is JetStream enabled, and on a cluster do enough nodes run for nats.replicas?)", err, streamWait)
}

// streamWait is how long a starting service waits for JetStream.
const streamWait = 30 * time.Second

func registry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

func serve(ctx context.Context, s *System, name, addr string, h http.Handler) (string, error) {
	ready := make(chan string, 1)
	errc := make(chan error, 1)
	s.goRun(name+" http", func() error {
		err := httpx.Serve(ctx, addr, h, ready)
		errc <- err
		return err
	})
	select {
	case a := <-ready:
		return a, nil
	case err := <-errc:
		return "", err
	case <-time.After(10 * time.Second):
		return "", fmt.Errorf("%s http on %s not listening after 10s", name, addr)
	}
}

// consumer is the durable consumer a dispatcher or watchdog replica reads
// the log with: berth-<service>-<instance> (events.ServiceConsumer), an
// exact name, so that NATS permissions can grant each role its own
// consumers and nothing else (berth nats-auth --instances). A restart of
// the same instance replaces its consumer (the loop starts from its
// snapshot); two live replicas must not share an instance name, and the
// consumer refuses to take over one another process is reading.
func consumer(cfg *config.Config, service string) *eventlog.Consumer {
	return &eventlog.Consumer{Name: events.ServiceConsumer(service, instance(cfg))}
}

// DispatcherKeyFile is where this instance's dispatcher keeps the curve
// key it seals placements with: <data_dir>/dispatcher/<instance>/curve.seed.
func DispatcherKeyFile(cfg *config.Config) string {
	return filepath.Join(cfg.DataDir, "dispatcher", instance(cfg), "curve.seed")
}

// instance names this process among replicas of its service: the config's
// instance, else BERTH_INSTANCE, else the host name (made a valid consumer
// name token).
func instance(cfg *config.Config) string {
	if cfg != nil && cfg.Instance != "" {
		return cfg.Instance
	}
	if inst := os.Getenv("BERTH_INSTANCE"); inst != "" {
		return consumerSafe(inst)
	}
	inst, _ := os.Hostname()
	return consumerSafe(inst)
}

// trustOwnKey publishes the dispatcher's sealing key in berth_trust where
// this credential may (`berth dev`, a NATS without authorization); where
// only the admin may, it says what the admin must run. Agents open only
// placements sealed by a trusted key.
func trustOwnKey(ctx context.Context, js jetstream.JetStream, pub, inst string, logger *slog.Logger) {
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := trust.AddDispatcher(tctx, js, pub, "dispatcher "+inst); err != nil {
		logger.Warn("this dispatcher's sealing key is not trusted yet: agents refuse its placements until the admin runs `berth trust add "+pub+"`",
			"key", pub, "err", err)
		return
	}
	logger.Info("sealing key trusted", "key", pub)
}

// consumerSafe keeps what a JetStream consumer name may hold.
func consumerSafe(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		}
		return '_'
	}, s)
}

// loopMetrics exports a loop's consumer counters.
func loopMetrics(reg *prometheus.Registry, l *eventlog.Loop) {
	counter := func(name, help string, read func(eventlog.LoopStats) uint64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(read(l.Stats())) }))
	}
	counter(events.MetricLogRedeliveredTotal, "Log messages the server delivered again (not acked within AckWait, or retried after a failed reaction).",
		func(s eventlog.LoopStats) uint64 { return s.Redelivered })
	counter(events.MetricLogConsumerRecreatedTotal, "Times the durable consumer was found stalled or gone and recreated.",
		func(s eventlog.LoopStats) uint64 { return s.Recreated })
	counter(events.MetricLogReactionPanicsTotal, "Deliveries whose fold or reaction panicked (each is retried up to MaxDeliver).",
		func(s eventlog.LoopStats) uint64 { return s.Panics })
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: events.MetricLogConsumerPending,
		Help: "Facts the server holds for this service's consumer and has not delivered yet (its lag; -1: unknown)."},
		func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if n, ok := l.Lag(ctx); ok {
				return float64(n)
			}
			return -1
		}))
	counter(events.MetricLogParkedTotal, "Poison facts parked in the "+events.BucketParked+" KV bucket and skipped by the fold.",
		func(s eventlog.LoopStats) uint64 { return s.Parked })
	counter(events.MetricLogRefusedTotal, "Facts refused because their subject does not confirm their payload or author (law 10), parked in "+events.BucketParked+".",
		func(s eventlog.LoopStats) uint64 { return s.Refused })
	counter(events.MetricLogDuplicateMismatchTotal, "Duplicate answers whose stored fact, read back, was another fact under the same id; each was appended again under a fresh id.",
		func(s eventlog.LoopStats) uint64 { return s.Mismatched })
}

// stuckAfter is how long a service may hold undelivered facts before health
// says it is stuck: past the consumer's own stall recreation (10 s) and a
// reconnect, so only a fault that recreation did not mend shows.
const stuckAfter = 30 * time.Second

// loopHealthy is the shared liveness rule: caught up with the log, the loop
// turned within the last few ticks (a wedged loop is unhealthy), and its
// consumer is not holding facts it has stopped delivering.
func loopHealthy(l *eventlog.Loop) (bool, map[string]any) {
	stale := time.Since(l.LastProgress())
	stuck, pending := l.StuckLast(stuckAfter) // off the request: never waits on NATS
	ok := l.CaughtUp() && stale < 10*time.Second && !stuck
	st := l.Stats()
	return ok, map[string]any{"caught_up": l.CaughtUp(), "last_seq": l.LastSeq(), "loop_idle_seconds": stale.Seconds(),
		"stuck": stuck, "undelivered": pending,
		"parked_events": st.Parked, "refused_facts": st.Refused, "host_overclaims": st.Overclaims, "ids_taken": st.Mismatched, "consumer_recreated": st.Recreated, "log_truncated": l.Truncated()}
}

// statusHandler serves the live projection's status (GET /status), the
// view `berth replay --check` compares with a fresh replay.
func statusHandler(read func(context.Context, func(*events.Fleet)) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		var st events.Status
		if err := read(ctx, func(f *events.Fleet) { st = f.Status() }); err != nil {
			http.Error(w, "the service's loop did not answer: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	}
}

// Dispatcher starts the dispatcher and its HTTP endpoints.
func Dispatcher(ctx context.Context, s *System, cfg *config.Config, logger *slog.Logger) (*dispatch.Dispatcher, string, error) {
	nc, js, sh, err := connect(ctx, cfg, "berth-dispatcher", natsauth.RoleDispatcher)
	if err != nil {
		return nil, "", err
	}
	logger = logger.With("service", "dispatcher")
	dc := cfg.Dispatcher
	app := &eventlog.Appender{JS: js, Source: "berth/dispatcher", Role: events.RoleDispatcher}
	installs, err := newInstallations(ctx, js, cfg, app, logger)
	if err != nil {
		nc.Close()
		return nil, "", err
	}
	minter, budget, sets := installs[0].rest, installs[0].budget, installs[0].sets
	redeliverer, err := redelivererFor(dc, minter)
	if err != nil {
		nc.Close()
		return nil, "", err
	}
	reg := registry()
	metrics := dispatch.NewMetrics(reg)
	d, err := dispatch.New(&eventlog.Loop{JS: js, Filters: []string{events.SubjectAll}, Tick: 500 * time.Millisecond,
		SnapshotKey: events.SnapshotKeyDispatcher, Consumer: consumer(cfg, "dispatcher"), Replicas: cfg.NATS.Replicas}, app, sets.minterOr(minter),
		dispatch.Options{Params: dispatch.Params{MaxAttempts: dc.MaxAttempts, Warm: warmPools(dc.WarmPools),
			RegistrationTimeout: cfg.Watchdog.RegistrationTimeout, ProvisionTimeout: cfg.Watchdog.ProvisionTimeout,
			ProbeAfter: dc.ProbeAfter, ProbeMax: dc.ProbeMax}, MintTimeout: dc.MintTimeout,
			Retention: cfg.Watchdog.Retention, Budget: budget, Logger: logger,
			Reconcile:  dispatch.Reconcile{After: dc.ReconcileAfter, Every: dc.ReconcileEvery, Limit: dc.ReconcileLimit},
			Sweep:      dispatch.Sweep{Every: dc.RunnerSweepEvery, Grace: dc.RunnerSweepGrace, Limit: dc.RunnerSweepLimit},
			SweepScope: dc.GitHub.Scope, SweepOrg: dc.GitHub.Org,
			Redeliverer: redeliverer, CurveSeedFile: DispatcherKeyFile(cfg), ScaleSetJob: installs.scaleSetJob(),
			Installations: installs.more()}, metrics)
	if err != nil {
		nc.Close()
		return nil, "", err
	}
	if authConfigured(cfg) {
		// Only the admin may write berth_trust: say what it must run.
		logger.Info("sealing key: agents open this dispatcher's placements once the admin trusts it",
			"key", d.SealingKey(), "admin", "berth --nats-nkey admin.nk trust add "+d.SealingKey())
	} else {
		trustOwnKey(ctx, js, d.SealingKey(), instance(cfg), logger)
	}
	loopMetrics(reg, d.Loop)
	mux := dispatcherMux(reg, d, installs, sh)
	if err := installs.webhooks(mux, dc, app, logger, metrics, d); err != nil {
		nc.Close()
		return nil, "", err
	}
	addr, err := serve(ctx, s, "dispatcher", dc.Listen, mux)
	if err != nil {
		nc.Close()
		return nil, "", err
	}
	s.goRun("dispatcher", func() error {
		defer nc.Close()
		return d.Run(ctx)
	})
	for _, in := range installs {
		if in.sets != nil {
			in.sets.start(ctx, s, d)
		}
	}
	if err := servePage(ctx, s, cfg, d.Read, js, streamOf(sh), logger); err != nil {
		return nil, "", err
	}
	logger.Info("dispatcher listening", "addr", addr, "github", dc.GitHub.APIURL)
	return d, addr, nil
}

// dispatcherMux serves the dispatcher's /healthz, /metrics and /status.
func dispatcherMux(reg *prometheus.Registry, d *dispatch.Dispatcher, installs installations, sh *streamHealth) *http.ServeMux {
	mux := httpx.Mux(reg, func() (bool, any) {
		ok, detail := loopHealthy(d.Loop)
		// GitHub's part (law 11): a refusal of the App's credentials
		// pauses every call and is degraded (503); a rate limit is
		// shown, it lifts by itself at the reset. Each installation
		// after the default says so under its name.
		refused := false
		for i, in := range installs {
			reason, until := in.budget.Paused(time.Now())
			key := "github_paused"
			if i > 0 {
				key = "github_paused_" + in.name
			}
			detail[key] = reason
			if reason != "" {
				detail[key+"_until"] = until.UTC().Format(time.RFC3339)
			}
			refused = refused || reason == "auth"
		}
		return sh.add(ok && !refused, detail), detail
	})
	mux.HandleFunc("GET /status", statusHandler(func(ctx context.Context, fn func(*events.Fleet)) error { return d.Read(ctx, fn) }))
	return mux
}

// githubClient is one installation's go-github client: through the App's
// installation token when an App is configured, else with the token.
func githubClient(gh config.GitHub) (*github.Client, error) {
	var hc *http.Client
	token := config.Secret(gh.Token, gh.TokenEnv)
	if app := gh.App; app.ID != 0 {
		tr, err := dispatch.AppTransport(dispatch.App{ID: app.ID, InstallationID: app.InstallationID, PrivateKeyFile: app.PrivateKeyFile},
			gh.APIURL, nil, nil)
		if err != nil {
			return nil, err
		}
		hc, token = &http.Client{Transport: tr}, ""
	}
	return dispatch.NewGitHubClient(gh.APIURL, token, hc)
}

// redelivererFor is the hook-deliveries client of
// dispatcher.reconcile_redeliver, nil when it is off: the App's own webhook
// (called with the App's JWT), or the organization or repository webhook
// github.hook_id names (called like every other API call).
func redelivererFor(dc config.Dispatcher, m *dispatch.GitHubMinter) (dispatch.Redeliverer, error) {
	if !dc.ReconcileRedeliver {
		return nil, nil
	}
	g := dc.GitHub
	r := &dispatch.GitHubRedeliverer{Client: m.Client, Org: g.Org, HookID: g.HookID, Budget: m.Budget}
	if owner, repo, ok := strings.Cut(g.HookRepo, "/"); ok {
		r.Org, r.Repo = owner, repo
	}
	if g.HookID == 0 {
		tr, err := dispatch.AppJWTTransport(dispatch.App{ID: g.App.ID, InstallationID: g.App.InstallationID, PrivateKeyFile: g.App.PrivateKeyFile},
			g.APIURL, nil, nil)
		if err != nil {
			return nil, err
		}
		if r.Client, err = dispatch.NewGitHubClient(g.APIURL, "", &http.Client{Transport: tr}); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Watchdog starts the watchdog and its HTTP endpoints.
func Watchdog(ctx context.Context, s *System, cfg *config.Config, logger *slog.Logger) (*watchdog.Watchdog, string, error) {
	nc, js, sh, err := connect(ctx, cfg, "berth-watchdog", natsauth.RoleWatchdog)
	if err != nil {
		return nil, "", err
	}
	logger = logger.With("service", "watchdog")
	wc := cfg.Watchdog
	w := watchdog.New(js, &eventlog.Appender{JS: js, Source: "berth/watchdog", Role: events.RoleWatchdog}, watchdog.Params{
		ProvisionTimeout: wc.ProvisionTimeout, RegistrationTimeout: wc.RegistrationTimeout,
		TeardownTimeout: wc.TeardownTimeout, MaxJobDuration: wc.MaxJobDuration, HostTTL: wc.HostTTL,
		DemandWaitingAfter: wc.DemandWaitingAfter, DemandWaitingEvery: wc.DemandWaitingEvery, LeakGrace: wc.LeakGrace,
		AbandonedCap: wc.AbandonedCap, DegradeAfter: wc.DegradeAfter, DegradeWindow: wc.DegradeWindow,
	}, nil, logger)
	w.Retention = wc.Retention
	w.HeartbeatReplicas = cfg.NATS.Replicas
	w.Loop.SnapshotKey = events.SnapshotKeyWatchdog
	w.Loop.Consumer = consumer(cfg, "watchdog")
	w.Loop.Replicas = cfg.NATS.Replicas
	reg := registry()
	w.Metrics = watchdog.NewMetrics(reg)
	loopMetrics(reg, w.Loop)
	mux := httpx.Mux(reg, func() (bool, any) {
		ok, detail := loopHealthy(w.Loop)
		h := w.Health()
		detail["alarms"] = h.Alarms
		detail["abandoned_vms"] = h.Abandoned
		detail["abandoned_cap"] = wc.AbandonedCap
		detail["jobs_waiting_for_slot"] = h.Waiting
		detail["pools"] = h.Pools
		detail["cordons"] = h.Cordons
		return sh.add(ok && len(h.Alarms) == 0, detail), detail
	})
	mux.HandleFunc("GET /status", statusHandler(w.Read))
	addr, err := serve(ctx, s, "watchdog", wc.Listen, mux)
	if err != nil {
		nc.Close()
		return nil, "", err
	}
	s.goRun("watchdog", func() error {
		defer nc.Close()
		return w.Run(ctx)
	})
	logger.Info("watchdog listening", "addr", addr)
	return w, addr, nil
}

// Agent starts one host's vmagent, with the backend its config's single
// backend section names (built through the backend registry), and its
// HTTP endpoints.
func Agent(ctx context.Context, s *System, cfg *config.Config, ac config.Agent, logger *slog.Logger) (string, error) {
	h := cfg.BackendHost(ac)
	h.Logger = logger.With("service", "vmagent", "host", ac.Host)
	be, err := backend.Build(ctx, ac.Backend.Kind, ac.Backend.Settings, h)
	if err != nil {
		return "", fmt.Errorf("agent %s: %w", ac.Host, err)
	}
	return AgentWith(ctx, s, cfg, ac, be, logger)
}

// AgentWith is Agent with the backend given rather than built from the
// config (the benchmarks plug an in-process one); the step deadlines still
// come from ac.Backend's settings (backend.Steps).
func AgentWith(ctx context.Context, s *System, cfg *config.Config, ac config.Agent, be backend.Backend, logger *slog.Logger) (string, error) {
	nc, js, sh, err := connect(ctx, cfg, "berth-agent-"+ac.Host, natsauth.AgentRole(ac.Host))
	if err != nil {
		return "", err
	}
	logger = logger.With("service", "vmagent")
	pools := ac.AdvertisedPools() // each named shape is a pool of its own
	reg := registry()
	be = measure(be, reg)
	dataDir := filepath.Join(cfg.DataDir, "agents", ac.Host)
	var steps backend.Steps
	if st := ac.Backend.Steps(); st != nil {
		steps = *st
	}
	a, err := vmagent.New(js, &eventlog.Appender{JS: js, Source: "berth/vmagent/" + ac.Host, Role: events.RoleAgent,
		NoReadBack: true /* an agent may read only its own host's subjects (natsauth) */}, be, vmagent.Options{
		Host: ac.Host, Pools: pools, PhysicalCap: ac.PhysicalCap, Resources: ac.HostResources(), DataDir: dataDir,
		CreateTimeout: steps.CreateTimeout, StopTimeout: steps.StopTimeout, RetryBase: steps.RetryBase, Heartbeat: ac.Heartbeat, HeartbeatReplicas: cfg.NATS.Replicas, ShutdownTimeout: ac.ShutdownTimeout,
		InventoryEvery: ac.InventoryEvery, OrphanGrace: ac.OrphanGrace, Logger: logger, Trust: &trust.Set{JS: js},
	})
	if err != nil {
		nc.Close()
		return "", err
	}
	listen := ac.Listen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	s.mu.Lock()
	if s.Agents == nil {
		s.Agents = map[string]*vmagent.Agent{}
	}
	s.Agents[ac.Host] = a
	s.mu.Unlock()
	a.Loop.Consumer = &eventlog.Consumer{Name: events.AgentConsumer(ac.Host)}
	a.Loop.Replicas = cfg.NATS.Replicas
	loopMetrics(reg, a.Loop)
	addr, err := serve(ctx, s, "agent "+ac.Host, listen, httpx.Mux(reg, func() (bool, any) {
		ok, detail := loopHealthy(a.Loop)
		return sh.add(ok, detail), detail
	}))
	if err != nil {
		nc.Close()
		return "", err
	}
	s.goRun("agent "+ac.Host, func() error {
		defer nc.Close()
		return a.Run(ctx)
	})
	return addr, nil
}

// authOptions turns a credentials file and an nkey seed file into connect
// options; an unreadable seed is an error that names the file. A
// "credentials file" that holds a bare user seed (SU…, as `berth nats-auth`
// writes) is taken as an nkey file, so `berth agent install --creds-from`
// installs either kind.
func authOptions(creds, nkeyFile string) ([]nats.Option, error) {
	var opts []nats.Option
	if creds != "" {
		if b, err := os.ReadFile(creds); err == nil && bytes.HasPrefix(bytes.TrimSpace(b), []byte("SU")) && nkeyFile == "" {
			nkeyFile = creds
		} else {
			opts = append(opts, nats.UserCredentials(creds))
		}
	}
	if nkeyFile != "" {
		o, err := nats.NkeyOptionFromSeed(nkeyFile)
		if err != nil {
			return nil, fmt.Errorf("nats nkey file %s: %w (write one with `berth nats-auth`)", nkeyFile, err)
		}
		opts = append(opts, o)
	}
	return opts, nil
}

// ClientNKey and ClientCreds authenticate the tools' connections (the
// berth command sets them from --nats-nkey and BERTH_NATS_CREDS).
var ClientNKey, ClientCreds string

// JetStream opens a client connection for tools (status, events), as the
// cli role.
func JetStream(url string) (func(), jetstream.JetStream, error) {
	return JetStreamAs(url, natsauth.RoleCLI)
}

// JetStreamAs opens a client connection for a tool acting as role (cli,
// or admin for `berth stream apply`): role decides the inbox prefix its
// replies come on.
func JetStreamAs(url, role string) (func(), jetstream.JetStream, error) {
	opts, err := authOptions(ClientCreds, ClientNKey)
	if err != nil {
		return nil, nil, err
	}
	nc, js, err := eventlog.Connect(url, "berth-"+role, append(opts, nats.CustomInboxPrefix(natsauth.InboxPrefix(role)))...)
	if err != nil {
		return nil, nil, err
	}
	return nc.Close, js, nil
}

// warmPools turns the validated config into the dispatcher's warm targets.
func warmPools(in map[string]config.WarmPool) map[string]dispatch.WarmPool {
	if len(in) == 0 {
		return nil
	}
	out := map[string]dispatch.WarmPool{}
	for pool, w := range in {
		wp := dispatch.WarmPool{MinIdle: w.MinIdle, MaxIdleAge: w.MaxIdleAge, Hosts: w.Hosts}
		if w.TimeZone != "" {
			wp.Location, _ = time.LoadLocation(w.TimeZone) // validated with the config
		}
		for _, win := range w.Schedule {
			days, _ := config.ParseDays(win.Days)
			from, _ := config.ParseClock(win.From)
			to, _ := config.ParseClock(win.To)
			wp.Schedule = append(wp.Schedule, dispatch.WarmWindow{Days: days, From: from, To: to, MinIdle: win.MinIdle})
		}
		out[pool] = wp
	}
	return out
}
