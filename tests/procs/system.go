package procs

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/natsauth"
	"github.com/berth-ci/berth/services/vmagent/backend"
	execbe "github.com/berth-ci/berth/services/vmagent/backends/exec"
	"github.com/berth-ci/berth/tests/ghsim"
	"github.com/berth-ci/berth/tests/harness"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.yaml.in/yaml/v3"
)

// tagEnv marks every process a system starts, and (through inheritance)
// every exec step and simulated runner they start, so that cleanup finds
// them all, whatever process group or session they moved to.
const tagEnv = "BERTH_PROCS_TAG"

// Options shape a system.
type Options struct {
	NATSNodes   int      // 1 (default) or 3: a cluster, and the stream with 3 replicas
	Dispatchers int      // default 1
	Watchdogs   int      // default 1
	Hosts       []string // one agent each; default host-a, host-b
	// Env adds variables to a process's first start, by process name
	// (dispatcher-0, watchdog-0, agent-host-a), e.g. BERTH_CRASH_AT.
	Env map[string][]string
	// Tune adjusts the configuration after the defaults of Config.
	Tune func(*config.Config)
	// Auth runs NATS with the authorization `berth nats-auth` writes: each
	// service connects with its own nkey and may publish only its role's
	// facts; the harness connects as the cli user.
	Auth bool
}

// System is Berth as processes around an in-process GitHub simulator.
type System struct {
	t      *testing.T
	Dir    string
	Bins   Bins
	Config *config.Config
	NATS   *NATS
	Sim    *ghsim.Sim
	// Dispatchers, Watchdogs and Agents are the service processes; URLs
	// are their base URLs (for /status and replay --check), same order.
	Dispatchers, Watchdogs, Agents []*Proc
	DispatcherURLs, WatchdogURLs   []string
	// Auth is the generated authorization (Options.Auth), and AuthDir
	// where its seed files are (<role>.nk).
	Auth    *natsauth.Auth
	AuthDir string

	js          jetstream.JetStream
	nc          *nats.Conn
	dispatchers int // how many dispatcher processes (Options.Dispatchers)
	tag         string
	hook        *hookProxy
	vms         *vmWatch
	ctx         context.Context
	cancel      context.CancelFunc
	wg          sync.WaitGroup
}

// Start builds the binaries (once), starts NATS, the simulator with its
// webhook relay, and the services, and returns when every service serves
// its health endpoint. Cleanup kills everything and checks that no process
// of the system is left.
func Start(t *testing.T, o Options) *System {
	t.Helper()
	o.defaults()
	s := newSystem(t, Build(t))
	s.dispatchers = o.Dispatchers
	clientOpts := s.startNATSWithAuth(o)
	dispAddrs := s.startSim(o)
	var err error
	s.nc, s.js, err = eventlog.Connect(s.NATS.URL(), "procs-test", clientOpts...)
	if err != nil {
		t.Fatal(err)
	}
	s.vms = watchVMs(s.Dir)
	s.wg.Add(2)
	go func() { defer s.wg.Done(); s.vms.run(s.ctx) }()
	go func() { defer s.wg.Done(); s.redeliver(s.ctx) }()
	s.ApplyStream()
	s.startServices(o, dispAddrs)
	for i, u := range s.DispatcherURLs {
		s.awaitUnlessArmed(o, fmt.Sprintf("dispatcher-%d", i), u)
	}
	for i, u := range s.WatchdogURLs {
		s.awaitUnlessArmed(o, fmt.Sprintf("watchdog-%d", i), u)
	}
	for _, a := range s.Config.Agents {
		s.awaitUnlessArmed(o, "agent-"+a.Host, "http://"+a.Listen)
	}
	return s
}

// awaitUnlessArmed waits for a service's health, except one started with a
// crash point armed: it may die before it ever answers, and the test that
// armed it waits for its exit instead.
func (s *System) awaitUnlessArmed(o Options, name, url string) {
	for _, kv := range o.Env[name] {
		if strings.HasPrefix(kv, "BERTH_CRASH_AT=") {
			return
		}
	}
	s.awaitHealthz(url, 30*time.Second)
}

// defaults fills in the sizes Options leaves zero.
func (o *Options) defaults() {
	if o.NATSNodes == 0 {
		o.NATSNodes = 1
	}
	if o.Dispatchers == 0 {
		o.Dispatchers = 1
	}
	if o.Watchdogs == 0 {
		o.Watchdogs = 1
	}
	if len(o.Hosts) == 0 {
		o.Hosts = []string{"host-a", "host-b"}
	}
}

// newSystem makes the run's directory and tag, and registers the cleanup
// first, so that whatever Start starts after it is killed even when a later
// step fails the test.
func newSystem(t *testing.T, b Bins) *System {
	t.Helper()
	tagBytes := make([]byte, 8)
	_, _ = rand.Read(tagBytes)
	dir := t.TempDir()
	if keep := os.Getenv("BERTH_PROCS_DIR"); keep != "" {
		// Keep the run's logs, configs, store and fault records for a look.
		var err error
		if dir, err = os.MkdirTemp(keep, "procs-"); err != nil {
			t.Fatal(err)
		}
		t.Logf("procs: keeping the run's files in %s", dir)
	}
	s := &System{t: t, Dir: dir, Bins: b, tag: hex.EncodeToString(tagBytes)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	t.Cleanup(s.cleanup)
	return s
}

// startNATSWithAuth starts the NATS server or cluster, with the generated
// authorization when o.Auth asks for it, and returns the options the
// harness's own client connects with (the cli user's key).
func (s *System) startNATSWithAuth(o Options) []nats.Option {
	t := s.t
	t.Helper()
	var clientOpts []nats.Option
	if o.Auth {
		var err error
		if s.Auth, err = natsauth.Generate(o.Hosts, instances(max(o.Dispatchers, o.Watchdogs))); err != nil {
			t.Fatal(err)
		}
		s.AuthDir = filepath.Join(s.Dir, "auth")
		if _, err := s.Auth.Write(s.AuthDir); err != nil {
			t.Fatal(err)
		}
		opt, err := nats.NkeyOptionFromSeed(filepath.Join(s.AuthDir, natsauth.RoleCLI+".nk"))
		if err != nil {
			t.Fatal(err)
		}
		clientOpts = append(clientOpts, opt, nats.CustomInboxPrefix(natsauth.InboxPrefix(natsauth.RoleCLI)))
	}
	s.NATS = startNATS(t, s.Bins.NATS, s.Dir, s.tag, o.NATSNodes, s.Auth, clientOpts)
	return clientOpts
}

// startSim picks the dispatchers' addresses, starts the webhook relay to
// them and the GitHub simulator behind it, and writes the configuration
// that points at both; it returns the dispatchers' addresses.
func (s *System) startSim(o Options) []string {
	t := s.t
	t.Helper()
	fixtures, err := harness.FixturesDir(s.Bins.Root)
	if err != nil {
		t.Fatal(err)
	}
	dispAddrs := make([]string, o.Dispatchers)
	for i := range dispAddrs {
		dispAddrs[i] = fmt.Sprintf("127.0.0.1:%d", freePort(t))
		s.DispatcherURLs = append(s.DispatcherURLs, "http://"+dispAddrs[i])
	}
	s.hook = startHookProxy(t, dispAddrs)
	secret := "procs-secret-" + s.tag
	s.Sim, err = ghsim.New(ghsim.Config{WebhookURL: s.hook.url + "/webhook", WebhookSecret: secret,
		Org: "example-org", Repo: "example-repo", FixturesDir: fixtures, AcquireTimeout: 5 * time.Second,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	simURL, err := s.Sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Config = s.config(o, simURL, dispAddrs[0], secret)
	return dispAddrs
}

// ApplyStream runs the operator's first step, `berth stream apply`, with
// the admin's key under Options.Auth: the services only verify the stream.
func (s *System) ApplyStream() string {
	s.t.Helper()
	b, err := yaml.Marshal(s.Config)
	if err != nil {
		s.t.Fatal(err)
	}
	path := filepath.Join(s.Dir, "stream-apply.yaml")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		s.t.Fatal(err)
	}
	argv := []string{"--nats", s.NATS.URL()}
	if s.Auth != nil {
		argv = append(argv, "--nats-nkey", s.seedFile(natsauth.RoleAdmin))
	}
	ctx, cancel := context.WithTimeout(s.ctx, 90*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, s.Bins.Berth, append(argv, "stream", "apply", "--grant-agents", "--config", path)...).CombinedOutput()
	if err != nil {
		s.t.Fatalf("berth stream apply: %v\n%s", err, out)
	}
	if s.Auth != nil {
		// The admin's second step: trust each dispatcher replica's sealing
		// key (one per instance), or agents refuse its placements.
		for _, inst := range instances(s.dispatchers) {
			key := exec.CommandContext(ctx, s.Bins.Berth, "dispatcher", "key", "--config", path)
			key.Env = append(os.Environ(), "BERTH_INSTANCE="+inst)
			pub, err := key.Output()
			if err != nil {
				s.t.Fatalf("berth dispatcher key (instance %s): %v", inst, err)
			}
			trusted, err := exec.CommandContext(ctx, s.Bins.Berth, append(argv, "trust", "add", strings.TrimSpace(string(pub)))...).CombinedOutput()
			if err != nil {
				s.t.Fatalf("berth trust add: %v\n%s", err, trusted)
			}
			out = append(out, trusted...)
		}
	}
	return string(out)
}

// instances names n replicas of a service "1".."n": each dispatcher and
// watchdog process runs as one (config instance), its consumer granted by
// that name (berth nats-auth --instances).
func instances(n int) []string {
	out := make([]string, max(n, 1))
	for i := range out {
		out[i] = strconv.Itoa(i + 1)
	}
	return out
}

// startServices starts the dispatchers, the watchdogs and one agent per
// host, each with its own role's credentials.
func (s *System) startServices(o Options, dispAddrs []string) {
	for i := range o.Dispatchers {
		c := *s.Config
		c.NATS.NKeyFile = s.seedFile(natsauth.RoleDispatcher)
		c.Instance = strconv.Itoa(i + 1)
		c.Dispatcher.Listen = dispAddrs[i]
		c.Dispatcher.Page.Listen = "127.0.0.1:0" // several dispatchers on one machine
		s.Dispatchers = append(s.Dispatchers, s.service(o, fmt.Sprintf("dispatcher-%d", i), &c, "dispatcher"))
	}
	for i := range o.Watchdogs {
		c := *s.Config
		c.NATS.NKeyFile = s.seedFile(natsauth.RoleWatchdog)
		c.Instance = strconv.Itoa(i + 1)
		c.Watchdog.Listen = fmt.Sprintf("127.0.0.1:%d", freePort(s.t))
		s.WatchdogURLs = append(s.WatchdogURLs, "http://"+c.Watchdog.Listen)
		s.Watchdogs = append(s.Watchdogs, s.service(o, fmt.Sprintf("watchdog-%d", i), &c, "watchdog"))
	}
	for _, a := range s.Config.Agents {
		c := *s.Config
		// As `berth agent install --creds-from agent-HOST.nk` configures it:
		// a seed given as the credentials file.
		c.NATS.CredsFile = s.seedFile(natsauth.AgentRole(a.Host))
		s.Agents = append(s.Agents, s.service(o, "agent-"+a.Host, &c, "agent", "--host", a.Host))
	}
}

// config is harness.Config (the demo's two hosts with linux and macos
// pools) with the exec steps wrapped in deploy/exec/faults.sh (for its
// record of steps and its VM inventory), the inventory sweep on, and every
// deadline short, so that a crashed reaction is retried within seconds.
func (s *System) config(o Options, simURL, dispAddr, secret string) *config.Config {
	c := harness.Config(harness.Options{DataDir: filepath.Join(s.Dir, "data")}, s.Bins.Root, s.Bins.Runner, simURL, dispAddr, secret)
	c.NATS = config.NATS{URL: s.NATS.URL(), Replicas: 1} // the default duplicate window, as a fleet runs
	if o.NATSNodes > 1 {
		c.NATS.Replicas = 3
	}
	d := &c.Dispatcher
	d.MintTimeout = 3 * time.Second
	d.ReconcileAfter, d.ReconcileEvery, d.ReconcileLimit = 2*time.Second, time.Second, 50
	w := &c.Watchdog
	w.ProvisionTimeout, w.RegistrationTimeout, w.TeardownTimeout = 5*time.Second, 5*time.Second, 5*time.Second
	w.HostTTL = 10 * time.Second
	script := filepath.Join(s.Bins.Root, "deploy", "exec", "faults.sh")
	template := c.Agents[0]
	c.Agents = nil
	for _, h := range o.Hosts {
		a := template
		a.Host = h
		a.Listen = fmt.Sprintf("127.0.0.1:%d", freePort(s.t))
		a.Heartbeat = 500 * time.Millisecond
		a.InventoryEvery, a.OrphanGrace = time.Second, 3*time.Second
		fdir := s.FaultDir(h)
		if err := os.MkdirAll(fdir, 0o755); err != nil {
			s.t.Fatal(err)
		}
		// a fresh section: the template's is shared by every copy
		a.Backend = config.Backend{Kind: execbe.Kind, Settings: &execbe.Settings{
			Create: []string{"sh", script, "create"}, Stop: []string{"sh", script, "stop"}, List: []string{"sh", script, "list"},
			Assign: []string{"sh", script, "assign"},
			Env:    map[string]string{"BERTH_SIM_RUNNER": s.Bins.Runner, "BERTH_FAULT_DIR": fdir},
			Steps:  backend.Steps{CreateTimeout: 5 * time.Second, StopTimeout: 5 * time.Second, RetryBase: 200 * time.Millisecond},
		}}
		c.Agents = append(c.Agents, a)
	}
	if o.Tune != nil {
		o.Tune(c)
	}
	c.Defaults()
	if err := c.Validate(); err != nil {
		s.t.Fatal(err)
	}
	return c
}

// FaultDir is the fault script's control directory of a host (its calls
// record and its VM inventory, vms/).
func (s *System) FaultDir(host string) string { return filepath.Join(s.Dir, "faults", host) }

// Fault switches a fault of deploy/exec/faults.sh on for attempts matching
// globs on one host, e.g. Fault("host-a", "create-no-runner", "berth-42-1").
func (s *System) Fault(host, name string, globs ...string) {
	s.t.Helper()
	dir := s.FaultDir(host)
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(strings.Join(globs, "\n")+"\n"), 0o644); err != nil {
		s.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		s.t.Fatal(err)
	}
}

// service writes a process's config file and starts `berth <cmd>`.
func (s *System) service(o Options, name string, c *config.Config, cmd string, args ...string) *Proc {
	s.t.Helper()
	b, err := yaml.Marshal(c)
	if err != nil {
		s.t.Fatal(err)
	}
	path := filepath.Join(s.Dir, name+".yaml")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		s.t.Fatal(err)
	}
	argv := append([]string{s.Bins.Berth, "--log-level", logLevel(), cmd, "--config", path}, args...)
	p := newProc(name, filepath.Join(s.Dir, name+".log"), s.Dir, []string{tagEnv + "=" + s.tag}, argv...)
	if err := p.start(o.Env[name]); err != nil {
		s.t.Fatal(err)
	}
	return p
}

// seedFile is role's nkey seed file with Options.Auth, else "".
func (s *System) seedFile(role string) string {
	if s.Auth == nil {
		return ""
	}
	return filepath.Join(s.AuthDir, role+".nk")
}

// Procs is every process of the system: NATS nodes, then services.
func (s *System) Procs() []*Proc {
	var out []*Proc
	if s.NATS != nil {
		out = append(out, s.NATS.Nodes...)
	}
	out = append(out, s.Dispatchers...)
	out = append(out, s.Watchdogs...)
	return append(out, s.Agents...)
}

// Proc returns a process by name.
func (s *System) Proc(name string) *Proc {
	for _, p := range s.Procs() {
		if p.Name == name {
			return p
		}
	}
	s.t.Fatalf("no process %s", name)
	return nil
}

func (s *System) awaitHealthz(base string, within time.Duration) {
	s.t.Helper()
	deadline := time.Now().Add(within)
	c := &http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		if resp, err := c.Get(base + "/healthz"); err == nil {
			resp.Body.Close()
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("%s/healthz did not answer within %s", base, within)
}

// AwaitServing waits until a restarted service answers on its health
// endpoint again.
func (s *System) AwaitServing(p *Proc, within time.Duration) {
	s.t.Helper()
	for i, d := range s.Dispatchers {
		if d == p {
			s.awaitHealthz(s.DispatcherURLs[i], within)
		}
	}
	for i, w := range s.Watchdogs {
		if w == p {
			s.awaitHealthz(s.WatchdogURLs[i], within)
		}
	}
	for i, a := range s.Agents {
		if a == p {
			s.awaitHealthz("http://"+s.Config.Agents[i].Listen, within)
		}
	}
}

// redeliver plays the operator's "redeliver failed deliveries" job that
// GitHub recommends (GitHub never retries a failed delivery by itself): a
// delivery that failed while every dispatcher was down or the log was
// unavailable is redelivered, with its original id, until one is accepted.
func (s *System) redeliver(ctx context.Context) {
	last := map[string]time.Time{}
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		type outcome struct{ ok, pending bool }
		byID := map[string]*outcome{}
		var order []string
		for _, d := range s.Sim.Deliveries() {
			o := byID[d.ID]
			if o == nil {
				o = &outcome{}
				byID[d.ID] = o
				order = append(order, d.ID)
			}
			switch {
			case !d.Done:
				o.pending = true
			case d.Err == "" && d.StatusCode/100 == 2:
				o.ok = true
			}
		}
		for _, id := range order {
			o := byID[id]
			if o.ok || o.pending || time.Since(last[id]) < time.Second {
				continue
			}
			last[id] = time.Now()
			_ = s.Sim.Redeliver(id)
		}
	}
}

// Status reads a service's live projection (GET base/status).
func (s *System) Status(base string) (events.Status, error) {
	var st events.Status
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(base + "/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return st, fmt.Errorf("%s/status: %s %s", base, resp.Status, b)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// JetStream is the test's own connection to the log.
func (s *System) JetStream() jetstream.JetStream { return s.js }

// Replay folds the whole log, as a restarted service would.
func (s *System) Replay(ctx context.Context) (*events.Fleet, error) {
	return eventlog.Replay(ctx, s.js, nil)
}

// cleanup kills everything the system started, checks that nothing is
// left, and dumps the processes' logs when the test failed.
func (s *System) cleanup() {
	t := s.t
	if t.Failed() {
		s.dumpRefused()
	}
	s.cancel()
	s.wg.Wait()
	if s.Sim != nil {
		s.Sim.Close()
	}
	if s.hook != nil {
		s.hook.close()
	}
	if s.nc != nil {
		s.nc.Close()
	}
	var unexpected []string
	for _, p := range s.Procs() {
		if u := p.Unexpected(); u != "" {
			unexpected = append(unexpected, u)
		}
	}
	all := s.Procs()
	for i := len(all) - 1; i >= 0; i-- { // services first, NATS last
		all[i].Kill(t)
	}
	killTagged(s.tag)
	deadline := time.Now().Add(5 * time.Second)
	for left := tagged(s.tag); len(left) > 0; left = tagged(s.tag) {
		if time.Now().After(deadline) {
			t.Errorf("processes of the system left after cleanup: %v", left)
			break
		}
		killTagged(s.tag)
		time.Sleep(50 * time.Millisecond)
	}
	if len(unexpected) > 0 {
		t.Errorf("processes that exited on their own: %v", unexpected)
	}
	if t.Failed() || os.Getenv("BERTH_PROCS_LOGS") != "" {
		for _, p := range s.Procs() {
			if m := marked(p.Log, logMarkers, 40); m != "" {
				t.Logf("--- %s (%s), every line that says a fact was skipped, refused or parked:\n%s", p.Name, p.Log, m)
			}
			t.Logf("--- %s (%s), last lines:\n%s", p.Name, p.Log, tail(p.Log, 60))
		}
	}
}

// hookProxy stands where GitHub's webhook deliveries arrive: it forwards
// each to the first dispatcher that answers, as a load balancer in front of
// dispatcher replicas does; 502 when none answers.
type hookProxy struct {
	url      string
	srv      *http.Server
	backends []string
	next     atomic.Uint64
	wg       sync.WaitGroup
}

func startHookProxy(t *testing.T, backends []string) *hookProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &hookProxy{url: "http://" + ln.Addr().String(), backends: backends}
	client := &http.Client{Timeout: 9 * time.Second}
	h.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		first := int(h.next.Add(1))
		for i := range h.backends {
			be := h.backends[(first+i)%len(h.backends)]
			req, _ := http.NewRequestWithContext(r.Context(), r.Method, "http://"+be+r.URL.Path, bytes.NewReader(body))
			req.Header = r.Header.Clone()
			resp, err := client.Do(req)
			if err != nil {
				continue // that replica is down: try the next
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			w.WriteHeader(resp.StatusCode)
			_, _ = w.Write(b)
			return
		}
		http.Error(w, "no dispatcher answered", http.StatusBadGateway)
	})}
	h.wg.Add(1)
	go func() { defer h.wg.Done(); _ = h.srv.Serve(ln) }()
	return h
}

func (h *hookProxy) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = h.srv.Shutdown(ctx)
	h.wg.Wait()
}

// logLevel is the services' log level: BERTH_PROCS_LOG_LEVEL, default info.
func logLevel() string {
	if l := os.Getenv("BERTH_PROCS_LOG_LEVEL"); l != "" {
		return l
	}
	return "info"
}
