package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/natsembed"
	"github.com/berth-ci/berth/services/run"
	"github.com/berth-ci/berth/services/vmagent/backend"
	"github.com/berth-ci/berth/tests/ghsim"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Pool labels the bench fleet offers on every host.
var (
	LinuxLabels = []string{"self-hosted", "linux", "x64"}
	MacLabels   = []string{"self-hosted", "macos", "arm64"}
)

// FleetOptions shape one system under test.
type FleetOptions struct {
	Hosts      int
	LinuxSlots int // per host
	MacSlots   int // per host
	// PhysicalCap per host; 0 means the sum of the slots.
	PhysicalCap int
	// WedgeStops makes every backend stop hang until the fleet is closed.
	WedgeStops bool
	// StopTimeout is the agents' stop deadline; 0 means 15 s.
	StopTimeout time.Duration
	// AbandonedCap is the watchdog's abandoned-VM cordon threshold; 0 keeps
	// the default (2).
	AbandonedCap int
	// Warm keeps this many warm VMs in the linux pool; Boot is every VM's
	// boot time (the in-process backend's create delay).
	Warm     int
	Boot     time.Duration
	Fixtures string
	Logger   *slog.Logger `json:"-"`
	// HookSenders is how many webhook deliveries the simulator has in
	// flight at once (ghsim.Config.HookSenders; 0: one at a time).
	HookSenders int
	// KeepDeliveries bounds the webhooks the simulator remembers
	// (ghsim.Config.KeepDeliveries; 0: every one). GitHub keeps what it
	// sent outside Berth's processes: a long run's payloads would
	// otherwise sit in the heap the bench measures.
	KeepDeliveries int
	// JITFile: the VMs read their JIT configs from files (Env.JITFile).
	JITFile bool
	// Heartbeat is how often each agent beats; 0 means 1 s, five times
	// the agents' default, so that a small fleet's hosts show at once.
	Heartbeat time.Duration
	// World, when not empty, is the command line of the world process
	// (world.go): the simulator and the agents run there, not here, on at
	// most WorldProcs cores (0: every core).
	World      []string `json:"-"`
	WorldProcs int      `json:"-"`
}

// Fleet is a running system: embedded NATS, the GitHub simulator, the
// dispatcher, the watchdog and one agent per host with an InProc backend.
type Fleet struct {
	Sim      *ghsim.Sim
	Sys      *run.System
	NATSURL  string
	NC       *nats.Conn // the bench's own connection (observers, references)
	JS       jetstream.JetStream
	Backends []*InProc
	Hosts    int

	world *world // the simulator and the agents, when they run apart
	dir   string
	srv   interface {
		Shutdown()
		WaitForShutdown()
	}
	cancel context.CancelFunc
}

// StartFleet starts a fleet and waits until the dispatcher's fold shows every
// host online. On any error it closes what it started.
func StartFleet(ctx context.Context, o FleetOptions) (_ *Fleet, err error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.StopTimeout == 0 {
		o.StopTimeout = 15 * time.Second
	}
	dir, err := os.MkdirTemp("", "berth-bench-")
	if err != nil {
		return nil, err
	}
	f := &Fleet{dir: dir, Hosts: o.Hosts}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	if err := f.startNATS(filepath.Join(dir, "nats")); err != nil {
		return f, err
	}
	dispAddr, err := freeAddr()
	if err != nil {
		return f, err
	}
	const secret = "bench-secret"
	var simURL string
	if len(o.World) > 0 {
		f.world, simURL, err = startWorld(o.World, o.WorldProcs, WorldConfig{NATSURL: f.NATSURL, DispatcherAddr: dispAddr, Secret: secret, Fleet: o, LogLevel: logLevel(o.Logger)})
	} else {
		simURL, err = f.startSim(o, dispAddr, secret)
	}
	if err != nil {
		return f, err
	}
	cfg := fleetConfig(o, dir, f.NATSURL, dispAddr, simURL, secret)
	sctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	// Dev starts the dispatcher and the watchdog on the server above (the
	// config names it, so Dev embeds none) and no agent: the agents get the
	// in-process backend below.
	f.Sys, err = run.Dev(sctx, cfg, o.Logger)
	if err != nil {
		return f, err
	}
	if f.world != nil {
		err = f.world.call(ctx, http.MethodPost, "/agents", nil, nil)
	} else {
		err = f.startAgents(sctx, o, cfg)
	}
	if err != nil {
		return f, err
	}
	f.NC, f.JS, err = eventlog.Connect(f.NATSURL, "berth-bench")
	if err != nil {
		return f, err
	}
	return f, f.awaitHostsOnline(ctx, o.Hosts)
}

// startNATS starts the fleet's NATS server in this process. (Run in a
// process of its own as well, beside the world's, it made the scale
// phase slower here: on 2 cores every fact crossed one more process.)
func (f *Fleet) startNATS(storeDir string) error {
	srv, err := natsembed.StartEmbedded(natsembed.EmbeddedConfig{Listen: "127.0.0.1:0", StoreDir: storeDir})
	if err != nil {
		return err
	}
	f.srv, f.NATSURL = srv, srv.ClientURL()
	return nil
}

// startSim starts the GitHub simulator, sending its webhooks to the
// dispatcher's address, and returns its API URL.
func (f *Fleet) startSim(o FleetOptions, dispAddr, secret string) (string, error) {
	var err error
	f.Sim, err = ghsim.New(ghsim.Config{WebhookURL: "http://" + dispAddr + "/webhook", WebhookSecret: secret,
		Org: "example-org", Repo: "example-repo", FixturesDir: o.Fixtures, AcquireTimeout: 5 * time.Second,
		// GitHub's own budget (15,000 calls an hour, one JIT config per job)
		// would cap a long run near 4 jobs/s: the bench measures Berth.
		RateLimitPerHour: 1 << 30, HookSenders: o.HookSenders, KeepDeliveries: o.KeepDeliveries})
	if err != nil {
		return "", err
	}
	return f.Sim.Start("127.0.0.1:0")
}

// fleetConfig is the dispatcher's and the watchdog's configuration; the
// agents are added one by one by startAgents.
func fleetConfig(o FleetOptions, dir, natsURL, dispAddr, simURL, secret string) *config.Config {
	cfg := &config.Config{
		DataDir: dir,
		NATS:    config.NATS{URL: natsURL},
		Dispatcher: config.Dispatcher{Listen: dispAddr, WebhookSecret: secret, Page: config.Page{Listen: config.PageOff},
			GitHub: config.GitHub{APIURL: simURL, Token: "sim-token", Scope: "org", Org: "example-org"}},
		Watchdog: config.Watchdog{Listen: "127.0.0.1:0", AbandonedCap: o.AbandonedCap,
			ProvisionTimeout: 2 * time.Minute, RegistrationTimeout: 2 * time.Minute},
	}
	if o.Warm > 0 {
		cfg.Dispatcher.WarmPools = map[string]config.WarmPool{"linux": {MinIdle: o.Warm}}
	}
	cfg.Defaults()
	return cfg
}

// startAgents starts one agent per host, each on its own in-process
// backend, in the services' context.
func (f *Fleet) startAgents(sctx context.Context, o FleetOptions, cfg *config.Config) error {
	for i := 0; i < o.Hosts; i++ {
		ac := config.Agent{
			Host: "host-" + strconv.Itoa(i), Listen: "127.0.0.1:0", Heartbeat: cmp.Or(o.Heartbeat, time.Second),
			PhysicalCap: o.PhysicalCap, ShutdownTimeout: time.Millisecond,
			Pools: map[string]config.Pool{"linux": {Labels: LinuxLabels, Slots: o.LinuxSlots}},
			Backend: config.Backend{Kind: "bench", Settings: &backend.Steps{
				CreateTimeout: 20 * time.Second, StopTimeout: o.StopTimeout}},
		}
		if o.MacSlots > 0 {
			ac.Pools["macos"] = config.Pool{Labels: MacLabels, Slots: o.MacSlots}
		}
		one := &config.Config{Agents: []config.Agent{ac}}
		one.Defaults()
		be := NewInProc(o.WedgeStops)
		be.Boot, be.WarmCapable = o.Boot, o.Warm > 0
		f.Backends = append(f.Backends, be)
		if err := run.GrantAgentsAt(sctx, f.Sys.NATSURL, one.Agents, "bench"); err != nil {
			return err
		}
		var vms backend.Backend = inMemoryJIT{be}
		if o.JITFile {
			vms = be
		}
		if _, err := run.AgentWith(sctx, f.Sys, cfg, one.Agents[0], vms, o.Logger); err != nil {
			return err
		}
	}
	return nil
}

// awaitHostsOnline waits up to 30 s until the dispatcher's fold shows n
// hosts accepting work with their keys known: before that, placement would
// see a smaller fleet than the bench asked for.
func (f *Fleet) awaitHostsOnline(ctx context.Context, n int) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		online := 0
		if err := f.Snapshot(ctx, func(fl *events.Fleet) {
			for _, h := range fl.Hosts {
				if h.Accepts() && h.CurveKey != "" {
					online++
				}
			}
		}); err != nil {
			return err
		}
		if online == n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d hosts online in the dispatcher's fold after 30s", online, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Snapshot runs fn on the dispatcher's loop with its fold, bounded by 10 s.
func (f *Fleet) Snapshot(ctx context.Context, fn func(*events.Fleet)) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return f.Sys.Dispatcher.Read(ctx, fn)
}

// Settle compacts every service's fold as its own housekeeping will once
// events.DefaultSettleAfter has passed (at the default 72 h retention), so
// a run of minutes measures what finished jobs cost once settled.
func (f *Fleet) Settle(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	settle := func(fl *events.Fleet) {
		fl.Compact(time.Now().Add(events.DefaultSettleAfter+time.Minute), 72*time.Hour)
	}
	var reads []func(context.Context, func(*events.Fleet)) error
	if f.Sys.Dispatcher != nil { // not in the world process
		reads = append(reads, f.Sys.Dispatcher.Read, f.Sys.Watchdog.Read)
	}
	for _, a := range f.Sys.Agents {
		reads = append(reads, a.Read)
	}
	for _, read := range reads {
		if err := read(ctx, settle); err != nil {
			return err
		}
	}
	if f.world != nil {
		return f.world.call(ctx, http.MethodPost, "/settle", nil, nil)
	}
	return nil
}

// Close stops the services (agents drain at once), releases wedged stops,
// closes the simulator and the server, and removes the temporary directory.
func (f *Fleet) Close() error {
	var errs []error
	if f.cancel != nil {
		f.cancel()
	}
	if f.Sys != nil {
		if err := f.Sys.Wait(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, b := range f.Backends {
		b.Close()
	}
	if f.world != nil {
		if err := f.world.close(); err != nil {
			errs = append(errs, err)
		}
	}
	if f.NC != nil {
		f.NC.Close()
	}
	if f.Sim != nil {
		f.Sim.Close()
	}
	if f.srv != nil {
		f.srv.Shutdown()
		f.srv.WaitForShutdown()
	}
	if err := os.RemoveAll(f.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Enqueue offers one job to the simulator, here or in the world process,
// and returns its id.
func (f *Fleet) Enqueue(ctx context.Context, s ghsim.JobSpec) (int64, error) {
	if f.world == nil {
		return f.Sim.Enqueue(s), nil
	}
	var id int64
	return id, f.world.call(ctx, http.MethodPost, "/enqueue", s, &id)
}

// simJobs is the simulator's view of its jobs and runners, here or in the
// world process.
func (f *Fleet) simJobs(ctx context.Context) (worldJobs, error) {
	if f.world == nil {
		return worldJobs{Jobs: f.Sim.Jobs(), Runners: f.Sim.Runners()}, nil
	}
	var j worldJobs
	return j, f.world.call(ctx, http.MethodGet, "/jobs", nil, &j)
}

// closeSim closes the simulator, here or in the world process: a reading
// after it is Berth's and NATS's alone.
func (f *Fleet) closeSim(ctx context.Context) error {
	if f.world != nil {
		return f.world.call(ctx, http.MethodPost, "/close-sim", nil, nil)
	}
	f.Sim.Close()
	f.Sim = nil
	return nil
}

// RunnerFailures sums the runners that failed on their own across hosts;
// -1 when the world process cannot say.
func (f *Fleet) RunnerFailures() int {
	if f.world != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := f.world.state(ctx, false)
		if err != nil {
			return -1
		}
		return s.RunnerFailures
	}
	n := 0
	for _, b := range f.Backends {
		n += b.RunnerFailures()
	}
	return n
}

// logLevel is the lowest level l enables, for a process of its own.
func logLevel(l *slog.Logger) slog.Level {
	for _, lvl := range []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError} {
		if l.Enabled(context.Background(), lvl) {
			return lvl
		}
	}
	return slog.LevelError + 4 // nothing enabled: the discard handler
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
