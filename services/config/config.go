// Package config loads Berth's YAML configuration: one file can describe the
// whole fleet (for `berth dev`) or only the part one service needs.
package config

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/bytesize"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/vmagent/backend"
	"go.yaml.in/yaml/v3"
)

// Config is the whole file. Durations are Go durations ("90s", "10m").
type Config struct {
	// DataDir holds the embedded server's store and each agent's files.
	DataDir string `yaml:"data_dir"`
	// Instance names this process among the replicas of its service: its
	// consumer on the log is berth-<service>-<instance> (exact, so NATS
	// permissions can grant it by name: berth nats-auth --instances) and its
	// dispatcher sealing key lives under <data_dir>/dispatcher/<instance>.
	// Empty means BERTH_INSTANCE, else the host name. Two replicas of one
	// service must never share it: they would split the log between them.
	Instance   string     `yaml:"instance"`
	NATS       NATS       `yaml:"nats"`
	Dispatcher Dispatcher `yaml:"dispatcher"`
	Watchdog   Watchdog   `yaml:"watchdog"`
	Agents     []Agent    `yaml:"agents"`
}

// NATS says where the log lives.
type NATS struct {
	// URL of an external server; empty with `berth dev` means embedded.
	URL string `yaml:"url"`
	// Listen is the embedded server's client address (berth dev only).
	Listen string `yaml:"listen"`
	// Replicas of the stream: 1 on one server, 3 on a cluster.
	Replicas int `yaml:"replicas"`
	// DuplicateWindow is how long JetStream deduplicates Nats-Msg-Id
	// (default eventlog.DefaultDuplicateWindow, 30 s: a retried append's
	// reach; the NATS server keeps each id of the window in memory).
	DuplicateWindow time.Duration `yaml:"duplicate_window"`
	// MaxAge, MaxBytes and MaxMsgs bound the event log (JetStream limits
	// retention): once any is passed, the oldest facts are dropped. Every
	// service restarts from its snapshot (saved every minute) plus the tail,
	// so dropped facts are never missed while snapshots cover them.
	//
	// MaxAge defaults to 720h (30 days): disk stays bounded without anyone
	// sizing it, a month of history stays readable with `berth events` and
	// `berth replay --at`, and a stopped service or a lost snapshot bucket
	// has weeks to be noticed. "0s" keeps every fact for ever. It must be at
	// least watchdog.max_job_duration (or retention, if longer) plus one
	// day: see Validate. nil only before Defaults.
	MaxAge *time.Duration `yaml:"max_age"`
	// MaxBytes caps the stream's size ("10GiB", or bytes); 0, the default,
	// means no cap. A cap drops facts by volume, not age: set it as a
	// safety net for the server's disk, well above a month of facts.
	MaxBytes ByteSize `yaml:"max_bytes"`
	// MaxMsgs caps the number of facts; 0, the default, means no cap.
	MaxMsgs int64 `yaml:"max_msgs"`
	// CredsFile is a NATS credentials file (user JWT and seed, as `nsc
	// generate creds` writes it) to connect with; empty means none.
	// `berth agent --nats-creds` overrides it.
	CredsFile string `yaml:"creds_file"`
	// NKeyFile is a file holding the service's NATS nkey seed (SU…), as
	// `berth nats-auth` writes it; empty means none. The server knows the
	// public key and what the role may publish (deploy/nats/README.md).
	NKeyFile string `yaml:"nkey_file"`
}

// StreamMaxAge is MaxAge, 0 (no limit) when unset.
func (n NATS) StreamMaxAge() time.Duration {
	if n.MaxAge == nil {
		return 0
	}
	return *n.MaxAge
}

// Bounds below which a retention setting would drop facts the services
// still need; Validate explains each to the operator.
const (
	// MaxAgeSlack is how much longer than the longest a job can live (and
	// then stay in the projections) the log must keep facts: time to bring
	// a stopped service back, or to notice a lost snapshot, before the
	// facts its fold needs are gone.
	MaxAgeSlack = 24 * time.Hour
	// MinMaxBytes and MinMaxMsgs: a size cap drops facts in a burst, not by
	// age; below these (thousands of jobs' facts) a busy minute could drop
	// facts a snapshot does not cover yet.
	MinMaxBytes ByteSize = 100 << 20
	MinMaxMsgs  int64    = 100_000
)

// ByteSize is a size in bytes; YAML gives it as an integer or with a unit:
// "512MiB", "10GiB", "1TB" (see package bytesize).
type ByteSize = bytesize.Size

// Dispatcher is GitHub intake, slot booking and JIT minting.
type Dispatcher struct {
	Listen        string `yaml:"listen"`
	WebhookSecret string `yaml:"webhook_secret"`
	// WebhookSecretEnv names an environment variable holding the secret.
	WebhookSecretEnv string `yaml:"webhook_secret_env"`
	GitHub           GitHub `yaml:"github"`
	// MaxAttempts is how many placements may fail for the job's own fault
	// before it is declared unschedulable (law 11: failures charged to a
	// host, an image, a backend or GitHub never count).
	MaxAttempts int `yaml:"max_attempts"`
	// ProbeAfter: a degraded host gets one probe placement after this
	// back-off, doubled per failed probe up to ProbeMax.
	ProbeAfter time.Duration `yaml:"probe_after"`
	ProbeMax   time.Duration `yaml:"probe_max"`
	// MintTimeout bounds one JIT-config call to GitHub.
	MintTimeout time.Duration `yaml:"mint_timeout"`
	// ReconcileAfter: a queued or running job with no new fact for this long
	// is looked up through the API (GitHub never retries a failed webhook);
	// ReconcileEvery paces the rounds, ReconcileLimit caps calls per round.
	ReconcileAfter time.Duration `yaml:"reconcile_after"`
	ReconcileEvery time.Duration `yaml:"reconcile_every"`
	ReconcileLimit int           `yaml:"reconcile_limit"`
	// ReconcileRedeliver makes each reconcile round also ask GitHub to
	// redeliver failed workflow_job deliveries (younger than 3 days) that
	// the log does not hold, through the hook-deliveries API of the App
	// (github.app) or of the webhook github.hook_id names. Off by default.
	ReconcileRedeliver bool `yaml:"reconcile_redeliver"`
	// RunnerSweepEvery paces the runner sweep (plus up to a fifth in
	// jitter): GitHub's self-hosted runners are listed, and those named
	// after a Berth attempt that no live attempt accounts for (a lost mint
	// answer or placement) for RunnerSweepGrace are deleted, at most
	// RunnerSweepLimit a pass. A failed or empty list deletes nothing.
	RunnerSweepEvery time.Duration `yaml:"runner_sweep_every"`
	RunnerSweepGrace time.Duration `yaml:"runner_sweep_grace"`
	RunnerSweepLimit int           `yaml:"runner_sweep_limit"`
	// WarmPools keeps VMs booted before their jobs arrive, per pool; the
	// pool's hosts need a backend with an assign step (exec: an assign
	// command). None by default.
	WarmPools map[string]WarmPool `yaml:"warm_pools"`
	// Page is the operator's read-only page (services/page).
	Page Page `yaml:"page"`
}

// Page is where the dispatcher serves the operator's read-only page and
// who may read it. It listens apart from the webhook (which GitHub must
// reach), on loopback unless configured.
type Page struct {
	// Listen is its address (default 127.0.0.1:8090: this machine only);
	// "off" serves no page.
	Listen string `yaml:"listen"`
	// Token, when set (inline or from TokenEnv), is asked of every reader:
	// a bearer header, or ?token= once (the page keeps it in a cookie).
	Token    string `yaml:"token"`
	TokenEnv string `yaml:"token_env"`
	// User and Password (or PasswordEnv) ask for basic auth; with a token
	// too, either admits.
	User        string `yaml:"user"`
	Password    string `yaml:"password"`
	PasswordEnv string `yaml:"password_env"`
}

// PageOff is Page.Listen's value that serves no page.
const PageOff = "off"

// GitHub is where and as whom the dispatcher calls the REST API: one
// GitHub installation (an organization or repository, with a token or a
// GitHub App installation). dispatcher.github is one such section, or a
// list of them: the first entry is the default installation, whose jobs
// and pools carry no installation name; every further entry has a name,
// its jobs reach /webhook/NAME (or its scale sets), and only pools that
// say `installation: NAME` serve them. Each has its own rate budget.
type GitHub struct {
	// Name names an installation after the first (pools' installation).
	Name string `yaml:"name"`
	// WebhookSecret (or WebhookSecretEnv) is what this installation's
	// webhook signs with; empty: dispatcher.webhook_secret.
	WebhookSecret    string `yaml:"webhook_secret"`
	WebhookSecretEnv string `yaml:"webhook_secret_env"`
	// APIURL is the REST base, e.g. https://api.github.com/ or a GitHub
	// Enterprise Server's https://ghes.example.com/api/v3/.
	APIURL string `yaml:"api_url"`
	Token  string `yaml:"token"`
	// TokenEnv names an environment variable holding the token.
	TokenEnv string `yaml:"token_env"`
	// App authenticates as a GitHub App installation instead of a token.
	App GitHubApp `yaml:"app"`
	// Scope is "org" (runners registered to Org) or "repo" (to each job's repository).
	Scope         string `yaml:"scope"`
	Org           string `yaml:"org"`
	RunnerGroupID int64  `yaml:"runner_group_id"`
	// HookID names an organization webhook (of Org) or, with HookRepo
	// ("owner/repo"), a repository webhook, whose deliveries
	// reconcile_redeliver reads; 0 with an App means the App's webhook.
	HookID   int64  `yaml:"hook_id"`
	HookRepo string `yaml:"hook_repo"`
	// Intake is how jobs reach Berth: "webhooks" (the default: GitHub
	// POSTs workflow_job deliveries to /webhook) or "scaleset" (the pools
	// ScaleSet.Pools names are runner scale sets whose message queue the
	// dispatcher reads; every other pool still comes through webhooks).
	Intake   string   `yaml:"intake"`
	ScaleSet ScaleSet `yaml:"scale_set"`
	// More holds the further entries when dispatcher.github is a list
	// (Installations gives them all, in order).
	More []GitHub `yaml:"-"`
}

// Installations is every configured installation, the default first;
// none of them holds More.
func (g GitHub) Installations() []GitHub {
	first := g
	first.More = nil
	return append([]GitHub{first}, g.More...)
}

// InstallationOf is the name a fact gives this installation's jobs and
// pools: empty for the default (first) one.
func (g GitHub) InstallationOf(i int) string {
	if i == 0 {
		return ""
	}
	return g.Installations()[i].Name
}

// Intakes: how jobs reach Berth (GitHub.Intake).
const (
	IntakeWebhooks = "webhooks"
	IntakeScaleSet = "scaleset"
)

// ScaleSet configures the runner scale set intake (services/setintake).
type ScaleSet struct {
	// Pools are served through scale sets, one set per pool, named after
	// it, with the pool's labels, in RunnerGroup.
	Pools []string `yaml:"pools"`
	// ConfigURL is what the scale sets are registered to: the
	// organization or repository URL, e.g. https://github.com/example-org
	// (GitHub Enterprise Server: https://HOST/ORG). Empty: derived from
	// api_url and org.
	ConfigURL string `yaml:"config_url"`
	// RunnerGroup names the runner group; empty: the default group.
	RunnerGroup string `yaml:"runner_group"`
	// LeaseTTL is how long a set's lease in berth_scalesets may stand
	// still before another dispatcher replica takes its session over.
	LeaseTTL time.Duration `yaml:"lease_ttl"`
}

// ServesScaleSet reports whether pool's jobs come through a scale set.
func (g GitHub) ServesScaleSet(pool string) bool {
	return g.Intake == IntakeScaleSet && slices.Contains(g.ScaleSet.Pools, pool)
}

// GitHubApp is a GitHub App installation (preferred over a token: its
// installation tokens are short-lived and scoped).
type GitHubApp struct {
	ID             int64  `yaml:"id"`
	InstallationID int64  `yaml:"installation_id"`
	PrivateKeyFile string `yaml:"private_key_file"`
}

// Watchdog owns deadlines.
type Watchdog struct {
	Listen string `yaml:"listen"`
	// ProvisionTimeout: placed → runner started, or the slot is released and
	// the job placed again.
	ProvisionTimeout time.Duration `yaml:"provision_timeout"`
	// RegistrationTimeout: runner started → took a job, or the slot is
	// released and the job placed again (scenario BL-11).
	RegistrationTimeout time.Duration `yaml:"registration_timeout"`
	// TeardownTimeout: teardown requested → stopped, or the VM is abandoned.
	TeardownTimeout time.Duration `yaml:"teardown_timeout"`
	// MaxJobDuration: in progress longer than this, the job's slot is
	// released and its VM torn down (GitHub's own limit for self-hosted jobs
	// is 5 days).
	MaxJobDuration time.Duration `yaml:"max_job_duration"`
	// HostTTL: a host whose heartbeat the watchdog has not seen change for
	// this long, on its own clock, is lost (watchdog/liveness.go).
	HostTTL time.Duration `yaml:"host_ttl"`
	// DemandWaitingAfter and DemandWaitingEvery pace "demand waiting" reports.
	DemandWaitingAfter time.Duration `yaml:"demand_waiting_after"`
	DemandWaitingEvery time.Duration `yaml:"demand_waiting_every"`
	// LeakGrace: a pool whose held slots exceed the live attempts that
	// account for them for this long raises an alarm.
	LeakGrace time.Duration `yaml:"leak_grace"`
	// AbandonedCap: a host with this many abandoned VMs is cordoned until
	// late stops bring it below.
	AbandonedCap int `yaml:"abandoned_cap"`
	// DegradeAfter placement failures in a row charged to a host (its
	// machine, image or backend) within DegradeWindow mark it degraded.
	DegradeAfter  int           `yaml:"degrade_after"`
	DegradeWindow time.Duration `yaml:"degrade_window"`
	// Retention: terminal jobs and attempts leave the projections after this.
	Retention time.Duration `yaml:"retention"`
}

// Agent is one host's vmagent.
type Agent struct {
	Host        string          `yaml:"host"`
	Listen      string          `yaml:"listen"`
	PhysicalCap int             `yaml:"physical_cap"`
	Pools       map[string]Pool `yaml:"pools"`
	Backend     Backend         `yaml:"backend"`
	// Heartbeat is how often the agent proves it is alive (default
	// DefaultHeartbeat).
	Heartbeat time.Duration `yaml:"heartbeat"`
	// ShutdownTimeout: on SIGTERM the host drains; running jobs may finish
	// for this long before their VMs are stopped.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// InventoryEvery is how often the backend's real inventory is read for
	// the orphan sweep (0: 1 min); OrphanGrace is how long a VM no live
	// attempt owns may stay before it is stopped (0: 2 min).
	InventoryEvery time.Duration `yaml:"inventory_every"`
	OrphanGrace    time.Duration `yaml:"orphan_grace"`
	// Resources the host's VMs share, counted by their pools' machine
	// shapes at placement (shapes.go); unset: only physical_cap counts.
	Resources Resources `yaml:"resources"`
}

// Pool is what a host offers one pool: runner labels, slots, the machine
// its VMs get, and named machine shapes a job's labels may select
// (shapes.go).
type Pool struct {
	// Installation names the dispatcher.github entry whose jobs the pool
	// serves; empty: the first (default) one.
	Installation string   `yaml:"installation"`
	Labels       []string `yaml:"labels"`
	Slots        int      `yaml:"slots"`
	Machine      `yaml:",inline"`
	Shapes       map[string]Shape `yaml:"shapes"`
}

// Load reads, defaults and validates a file. Its mistakes are *Error
// values naming the file, the line and the key (see Parse).
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w (give --config the path of a config file; deploy/berth.example.yaml documents every setting)", err)
	}
	c, errs := parse(b)
	if len(errs) > 0 {
		return c, inFile(path, errs)
	}
	return c, nil
}

// Parse defaults and validates YAML bytes. It refuses unknown keys (with
// the nearest known one), values of the wrong type and impossible values,
// and reports every mistake at once, each an *Error with its line and key.
func Parse(b []byte) (*Config, error) {
	c, errs := parse(b)
	return c, errors.Join(errs...)
}

// parse decodes strictly, then defaults and validates what decoded; the
// decoder's lines place Validate's errors.
func parse(b []byte) (*Config, []error) {
	var c Config
	var root yaml.Node
	if err := yaml.Unmarshal(b, &root); err != nil {
		return nil, []error{&Error{Line: yamlLine(err), Msg: "not YAML: " + yamlMessage(err)}}
	}
	d := &decoder{lines: map[string]int{}}
	d.decode(&root, reflect.ValueOf(&c).Elem(), "")
	c.Defaults()
	// What did decode is validated too, so that one run reports every
	// mistake; a value that did not decode is left at its default.
	if errs := append(d.errs, placed(c.Validate(), d.lines)...); len(errs) > 0 {
		return &c, errs
	}
	return &c, nil
}

func or[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// DefaultHeartbeat is how often an agent beats unless its config says.
const DefaultHeartbeat = 5 * time.Second

// Defaults fills every unset field with the documented default.
func (c *Config) Defaults() {
	or(&c.DataDir, "./data")
	or(&c.NATS.Listen, "127.0.0.1:4222")
	or(&c.NATS.Replicas, 1)
	or(&c.NATS.DuplicateWindow, eventlog.DefaultDuplicateWindow)
	if c.NATS.MaxAge == nil {
		age := 30 * 24 * time.Hour
		c.NATS.MaxAge = &age
	}
	d := &c.Dispatcher
	or(&d.Listen, "127.0.0.1:8080")
	or(&d.MaxAttempts, 5)
	or(&d.MintTimeout, 10*time.Second)
	or(&d.ProbeAfter, 30*time.Second)
	or(&d.ProbeMax, 10*time.Minute)
	or(&d.ReconcileAfter, 5*time.Minute)
	or(&d.ReconcileEvery, time.Minute)
	or(&d.ReconcileLimit, 20)
	or(&d.RunnerSweepEvery, 5*time.Minute)
	or(&d.RunnerSweepGrace, 10*time.Minute)
	or(&d.RunnerSweepLimit, 20)
	d.GitHub.defaults()
	for i := range d.GitHub.More {
		d.GitHub.More[i].defaults()
	}
	or(&d.Page.Listen, "127.0.0.1:8090")
	w := &c.Watchdog
	or(&w.Listen, "127.0.0.1:8081")
	or(&w.ProvisionTimeout, 10*time.Minute)
	or(&w.TeardownTimeout, 5*time.Minute)
	or(&w.RegistrationTimeout, 10*time.Minute)
	or(&w.MaxJobDuration, 5*24*time.Hour)
	or(&w.HostTTL, 30*time.Second)
	or(&w.DemandWaitingAfter, 30*time.Second)
	or(&w.DemandWaitingEvery, 5*time.Minute)
	or(&w.LeakGrace, 15*time.Minute)
	or(&w.AbandonedCap, 2)
	or(&w.DegradeAfter, 3)
	or(&w.DegradeWindow, 15*time.Minute)
	or(&w.Retention, 72*time.Hour)
	for i := range c.Agents {
		a := &c.Agents[i]
		or(&a.Heartbeat, DefaultHeartbeat)
		or(&a.ShutdownTimeout, 10*time.Minute)
		if a.PhysicalCap == 0 {
			for _, p := range a.AdvertisedPools() { // shapes are pools of their own
				a.PhysicalCap += p.Slots
			}
		}
		a.Backend.defaults(c.BackendHost(*a))
	}
}

// BackendHost is what agent a's backend may know of it.
func (c *Config) BackendHost(a Agent) backend.Host {
	shapes := map[string]*events.Shape{}
	for pool, ps := range a.AdvertisedPools() {
		shapes[pool] = ps.Shape
	}
	return backend.Host{Name: a.Host, DataDir: c.DataDir, PhysicalCap: a.PhysicalCap, Shapes: shapes}
}

// Validate reports every problem at once, each with what to change.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	c.validateInstallations(bad)
	if d := c.Dispatcher; d.RunnerSweepEvery < 0 || d.RunnerSweepGrace < 0 {
		bad("dispatcher.runner_sweep_every %v / runner_sweep_grace %v: give positive durations (the grace outlasts a lost answer's retries: 10m)", d.RunnerSweepEvery, d.RunnerSweepGrace)
	}
	if c.Instance != "" {
		if err := events.ValidName("instance", c.Instance); err != nil {
			bad("instance: %v", err)
		}
	}
	if p := c.Dispatcher.Page; p.User != "" && Secret(p.Password, p.PasswordEnv) == "" {
		bad("dispatcher.page.user %q has no password: set dispatcher.page.password_env (or password), or drop user", p.User)
	}
	if p := c.Dispatcher.Page; p.Listen != PageOff && (p.Token != "" || p.TokenEnv != "") && Secret(p.Token, p.TokenEnv) == "" {
		bad("dispatcher.page.token_env %q is empty: export it, or drop token_env (the page would be open)", p.TokenEnv)
	}
	c.validateRetention(bad)
	c.validateWarm(bad)
	c.validateCounts(bad)
	c.validateAgents(bad)
	return errors.Join(errs...)
}

// validateCounts refuses counts and caps below what can work: the zero
// value means the default, so only negatives (and zero replicas) are left.
func (c *Config) validateCounts(bad func(string, ...any)) {
	for _, n := range []struct {
		key      string
		v, least int
	}{{"nats.replicas", c.NATS.Replicas, 1}, {"dispatcher.max_attempts", c.Dispatcher.MaxAttempts, 1},
		{"dispatcher.reconcile_limit", c.Dispatcher.ReconcileLimit, 1}, {"dispatcher.runner_sweep_limit", c.Dispatcher.RunnerSweepLimit, 1},
		{"watchdog.abandoned_cap", c.Watchdog.AbandonedCap, 1}, {"watchdog.degrade_after", c.Watchdog.DegradeAfter, 1}} {
		if n.v < n.least {
			bad("%s %d: give at least %d", n.key, n.v, n.least)
		}
	}
}

// validateAgents checks each agent: a valid, unique host, pools with
// slots and labels, a physical cap, and its backend's own section.
func (c *Config) validateAgents(bad func(string, ...any)) {
	seen := map[string]bool{}
	for i, a := range c.Agents {
		if err := events.ValidName("host", a.Host); err != nil {
			bad("agents[%d].host: %w", i, err)
		}
		if seen[a.Host] {
			bad("agents[%d].host %q appears twice: each host runs one agent", i, a.Host)
		}
		seen[a.Host] = true
		if a.PhysicalCap < 0 {
			bad("agents[%d].physical_cap %d: give how many VMs the host runs at once, at least 1 (or leave it out: the sum of the pools' slots)", i, a.PhysicalCap)
		}
		if len(a.Pools) == 0 {
			bad("agents[%d] (%s): no pools: give it at least one pool with labels and slots", i, a.Host)
		}
		for name, p := range a.Pools {
			if err := events.ValidName("pool", name); err != nil {
				bad("agents[%d].pools: %w", i, err)
			}
			if p.Slots < 1 || len(p.Labels) == 0 {
				bad("agents[%d].pools.%s: needs slots >= 1 and at least one label", i, name)
			}
		}
		validateShapes(fmt.Sprintf("agents[%d]", i), a, bad)
		a.Backend.validate(fmt.Sprintf("agents[%d].backend", i), c.BackendHost(a), backend.Report(bad))
	}
}

// validateRetention checks the stream's limits against what the services
// need the log for (see NATS.MaxAge).
func (c *Config) validateRetention(bad func(string, ...any)) {
	n, w := c.NATS, c.Watchdog
	age := n.StreamMaxAge()
	if age < 0 {
		bad("nats.max_age %v: give a positive duration such as 720h, or 0s to keep every fact for ever", age)
	}
	if age > 0 {
		if n.DuplicateWindow > age {
			bad("nats.duplicate_window %v is longer than nats.max_age %v: a fact cannot be deduplicated after it expired; shorten duplicate_window or raise max_age",
				n.DuplicateWindow, age)
		}
		longest, what := w.MaxJobDuration, "watchdog.max_job_duration"
		if w.Retention > longest {
			longest, what = w.Retention, "watchdog.retention"
		}
		if need := longest + MaxAgeSlack; age < need {
			bad("nats.max_age %v is too short: facts must outlive %s (%v) by a day (%v in all), so that a job's whole story stays in the log "+
				"and a service stopped for a while (snapshots are saved every minute) comes back with the facts it missed; "+
				"raise max_age to %v or more (or 0s for no limit), or lower %s", age, what, longest, need, need, what)
		}
	}
	if n.MaxBytes < 0 || (n.MaxBytes > 0 && n.MaxBytes < MinMaxBytes) {
		bad("nats.max_bytes %v: give 0 (no cap) or at least %v; a smaller cap drops facts by volume in a busy minute, before any snapshot covers them",
			n.MaxBytes, MinMaxBytes)
	}
	if n.MaxMsgs < 0 || (n.MaxMsgs > 0 && n.MaxMsgs < MinMaxMsgs) {
		bad("nats.max_msgs %d: give 0 (no cap) or at least %d; a smaller cap drops facts by count in a busy minute, before any snapshot covers them",
			n.MaxMsgs, MinMaxMsgs)
	}
}

// Secret resolves a value given inline or through an environment variable.
func Secret(inline, env string) string {
	if inline != "" {
		return inline
	}
	if env != "" {
		return os.Getenv(env)
	}
	return ""
}

func (g *GitHub) defaults() {
	or(&g.APIURL, "https://api.github.com/")
	or(&g.Scope, "org")
	or(&g.Intake, IntakeWebhooks)
	or(&g.ScaleSet.LeaseTTL, 6*time.Second)
}

// validateInstallations checks each dispatcher.github entry, their names
// (every entry after the first has a unique one) and that each pool's
// installation is one of them (when the config lists more than one: an
// agent's own config may leave the dispatcher's list out).
func (c *Config) validateInstallations(bad func(string, ...any)) {
	all := c.Dispatcher.GitHub.Installations()
	names := map[string]bool{}
	for i, gh := range all {
		at := "dispatcher.github"
		if len(all) > 1 {
			at = fmt.Sprintf("dispatcher.github[%d]", i)
		}
		c.validateGitHub(gh, at, bad)
		switch {
		case i == 0:
		case gh.Name == "":
			bad("%s.name: name every installation after the first (pools serve it with installation: NAME)", at)
		case events.ValidName("installation", gh.Name) != nil:
			bad("%s.name: %v", at, events.ValidName("installation", gh.Name))
		case names[gh.Name] || gh.Name == all[0].Name:
			bad("%s.name %q: given twice; each installation needs its own", at, gh.Name)
		}
		names[gh.Name] = true
	}
	if len(all) < 2 {
		return
	}
	for i, a := range c.Agents {
		for pool, p := range a.Pools {
			if p.Installation != "" && (!names[p.Installation] || p.Installation == all[0].Name) {
				bad("agents[%d].pools.%s.installation %q: name an entry of dispatcher.github after the first (leave it empty for the first, %q)",
					i, pool, p.Installation, all[0].Name)
			}
		}
	}
}

// validateGitHub checks one installation, at its dotted path.
func (c *Config) validateGitHub(gh GitHub, at string, bad func(string, ...any)) {
	if a := gh.App; a.ID != 0 && (a.InstallationID == 0 || a.PrivateKeyFile == "") {
		bad("%s.app: id, installation_id and private_key_file are all needed (see the App's settings and its installation URL)", at)
	}
	if s := gh.Scope; s != "org" && s != "repo" {
		bad("%s.scope %q: use org or repo", at, s)
	}
	if c.Dispatcher.ReconcileRedeliver && gh.HookID == 0 && gh.App.ID == 0 {
		bad("dispatcher.reconcile_redeliver needs the webhook whose deliveries to read: a GitHub App (%[1]s.app), or %[1]s.hook_id (with org, or hook_repo: owner/repo)", at)
	}
	if gh.HookID != 0 && gh.HookRepo == "" && gh.Org == "" {
		bad("%s.hook_id %d: set %[1]s.org (an organization webhook) or hook_repo: owner/repo (a repository webhook)", at, gh.HookID)
	}
	if gh.Intake != IntakeWebhooks && gh.Intake != IntakeScaleSet {
		bad("%s.intake %q: use webhooks or scaleset", at, gh.Intake)
	} else if gh.Intake == IntakeScaleSet && len(gh.ScaleSet.Pools) == 0 {
		bad("%[1]s.intake scaleset serves the pools %[1]s.scale_set.pools names: list at least one", at)
	} else if gh.Intake == IntakeScaleSet && gh.ScaleSet.ConfigURL == "" && gh.Org == "" {
		bad("%[1]s.scale_set.config_url: give the organization or repository URL the scale sets belong to (or set %[1]s.org)", at)
	}
	if r := gh.HookRepo; r != "" && strings.Count(r, "/") != 1 {
		bad("%s.hook_repo %q: give owner/repo", at, r)
	}
}
