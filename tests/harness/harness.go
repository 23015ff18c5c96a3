package harness

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/run"
	"github.com/berth-ci/berth/services/vmagent/backend"
	execbe "github.com/berth-ci/berth/services/vmagent/backends/exec"
	"github.com/berth-ci/berth/tests/ghsim"
)

// Options shape a run.
type Options struct {
	Jobs        int           // how many jobs to enqueue
	MacOSShare  float64       // fraction of jobs for the macos pool (the rest: linux)
	MinDuration time.Duration // job durations are uniform in [Min, Max]
	MaxDuration time.Duration
	Arrival     time.Duration // jobs arrive spread over this long
	FailShare   float64       // fraction of jobs whose conclusion is failure (still served)
	Seed        uint64
	DataDir     string // a fresh directory for NATS, agents and binaries
	NATSListen  string // embedded NATS address; "127.0.0.1:0" picks a free port
	Timeout     time.Duration
	Progress    io.Writer // live progress lines; nil for none
	Logger      *slog.Logger
	// Warm keeps this many warm VMs in the linux pool (issue 8); 0: none.
	Warm int
	// Tune, when set, adjusts the fleet's configuration after the defaults
	// (hosts, pools, slots, physical caps, exec commands and their env,
	// step timeouts, watchdog deadlines): the scenario tests shape their
	// fleet with it. The demo leaves it nil.
	Tune func(*config.Config)
	// SimTune, when set, adjusts the simulator's configuration (the
	// scale-set tests shorten its long-poll and re-offer times).
	SimTune func(*ghsim.Config)
	// ScaleSetPools are served through runner scale sets
	// (dispatcher.github.intake scaleset); the other pools through
	// webhooks. Empty: every pool through webhooks.
	ScaleSetPools []string
}

// Fleet is a running system plus its simulator, for tests that drive it.
type Fleet struct {
	Sim    *ghsim.Sim
	Sys    *run.System
	Config *config.Config
	Root   string
	cancel context.CancelFunc
}

// Start builds the simulated runner, starts the GitHub simulator and the
// whole system (embedded NATS, dispatcher, watchdog, two agents with the
// exec backend), and returns once everything listens. ctx bounds the
// start; the system then runs until Stop, so an interrupted run can
// still be summed up from its live projection.
func Start(ctx context.Context, o Options) (*Fleet, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	fixtures, err := FixturesDir(root)
	if err != nil {
		return nil, err
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	runner, err := BuildSimRunner(ctx, root, SimRunnerDir(o.DataDir))
	if err != nil {
		return nil, err
	}
	secret := fmt.Sprintf("demo-secret-%d", o.Seed)
	// The dispatcher listens on any free port; the sim learns where once
	// it does (SetWebhookURL). A port found free before it bound could be
	// taken first by another process (a parallel test package did).
	simCfg := ghsim.Config{WebhookSecret: secret,
		Org: "example-org", Repo: "example-repo", FixturesDir: fixtures, Logger: o.Logger, AcquireTimeout: 5 * time.Second}
	if o.SimTune != nil {
		o.SimTune(&simCfg)
	}
	sim, err := ghsim.New(simCfg)
	if err != nil {
		return nil, err
	}
	simURL, err := sim.Start("127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	cfg := Config(o, root, runner, simURL, "127.0.0.1:0", secret)
	if len(o.ScaleSetPools) > 0 {
		cfg.Dispatcher.GitHub.Intake = config.IntakeScaleSet
		cfg.Dispatcher.GitHub.ScaleSet.Pools = o.ScaleSetPools
	}
	if o.Tune != nil {
		o.Tune(cfg)
	}
	life, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel) // an interrupted start ends what started …
	sys, err := run.Dev(life, cfg, o.Logger)
	stop() // … a started system runs until Stop
	if err != nil {
		cancel()
		sim.Close()
		return nil, err
	}
	sim.SetWebhookURL("http://" + sys.DispatcherAddr + "/webhook")
	return &Fleet{Sim: sim, Sys: sys, Config: cfg, Root: root, cancel: cancel}, nil
}

// Stop shuts everything down and waits for it.
func (f *Fleet) Stop() error {
	f.cancel()
	err := f.Sys.Wait()
	f.Sim.Close()
	return err
}

// Config is the demo fleet: pools linux (4 slots a host) and macos (2 a
// host, physical cap 2 like a real Mac) on two hosts.
func Config(o Options, root, runner, simURL, dispAddr, secret string) *config.Config {
	script := filepath.Join(root, "deploy", "exec", "sim-runner.sh")
	agent := func(host string) config.Agent {
		return config.Agent{
			Host:      host,
			Heartbeat: time.Second,
			// A stopping demo does not wait for its jobs: the drain lasts
			// seconds, then the VMs still running are stopped.
			ShutdownTimeout: 2 * time.Second,
			Pools: map[string]config.Pool{
				"linux": {Labels: []string{"self-hosted", "linux", "x64"}, Slots: 4},
				"macos": {Labels: []string{"self-hosted", "macos", "arm64"}, Slots: 2},
			},
			Backend: config.Backend{Kind: execbe.Kind, Settings: &execbe.Settings{
				Create: []string{"sh", script, "create"}, Stop: []string{"sh", script, "stop"},
				Assign: []string{"sh", script, "assign"},
				Env:    map[string]string{"BERTH_SIM_RUNNER": runner},
				Steps:  backend.Steps{CreateTimeout: 20 * time.Second, StopTimeout: 15 * time.Second},
			}},
		}
	}
	cfg := &config.Config{
		DataDir: o.DataDir,
		NATS:    config.NATS{Listen: o.NATSListen},
		Dispatcher: config.Dispatcher{Listen: dispAddr, WebhookSecret: secret, Page: config.Page{Listen: "127.0.0.1:0"},
			GitHub: config.GitHub{APIURL: simURL, Token: "sim-token", Scope: "org", Org: "example-org"}},
		Watchdog: config.Watchdog{Listen: "127.0.0.1:0", ProvisionTimeout: 30 * time.Second, RegistrationTimeout: 30 * time.Second, TeardownTimeout: 30 * time.Second,
			HostTTL: 10 * time.Second, DemandWaitingAfter: 30 * time.Second, DemandWaitingEvery: time.Minute},
		Agents: []config.Agent{agent("host-a"), agent("host-b")},
	}
	if o.Warm > 0 {
		cfg.Dispatcher.WarmPools = map[string]config.WarmPool{"linux": {MinIdle: o.Warm}}
	}
	cfg.Defaults()
	return cfg
}

// SimRunnerDir is where a fleet with data directory dataDir keeps the
// ghsim binary its "VMs" run.
func SimRunnerDir(dataDir string) string { return filepath.Join(dataDir, "bin") }

// BuildSimRunner compiles the ghsim binary the demo's "VMs" run.
func BuildSimRunner(ctx context.Context, root, dir string) (string, error) {
	out := filepath.Join(dir, "ghsim")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/ghsim")
	cmd.Dir = filepath.Join(root, "tests")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the simulated runner: %v\n%s", err, b)
	}
	return out, nil
}

// JobPlan is the workload: labels, durations and outcomes drawn from a seed.
func JobPlan(o Options) []ghsim.JobSpec {
	r := rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15))
	linux := [][]string{{"self-hosted", "linux"}, {"self-hosted", "linux", "x64"}, {"self-hosted", "Linux", "X64"}}
	macos := [][]string{{"self-hosted", "macos"}, {"self-hosted", "macOS", "ARM64"}}
	out := make([]ghsim.JobSpec, o.Jobs)
	for i := range out {
		labels := linux[r.IntN(len(linux))]
		if r.Float64() < o.MacOSShare {
			labels = macos[r.IntN(len(macos))]
		}
		d := o.MinDuration + time.Duration(r.Int64N(int64(o.MaxDuration-o.MinDuration)+1))
		conclusion := "success"
		if r.Float64() < o.FailShare {
			conclusion = "failure"
		}
		out[i] = ghsim.JobSpec{Labels: labels, Duration: d, Conclusion: conclusion}
	}
	return out
}

// Status reads the live dispatcher's projection.
func (f *Fleet) Status(ctx context.Context) (events.Status, error) {
	var st events.Status
	err := f.Sys.Dispatcher.Read(ctx, func(fl *events.Fleet) { st = fl.Status() })
	return st, err
}
