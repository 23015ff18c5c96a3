package scenario

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/run"
	"github.com/berth-ci/berth/services/testkit"
	execbe "github.com/berth-ci/berth/services/vmagent/backends/exec"
	"github.com/berth-ci/berth/tests/ghsim"
	"github.com/berth-ci/berth/tests/harness"
	"github.com/nats-io/nats.go/jetstream"
)

// testLimit bounds a whole scenario; every wait inside it has its own,
// shorter deadline.
const testLimit = 90 * time.Second

// The runner labels of the two pools the scenarios use.
var (
	linuxLabels = []string{"self-hosted", "linux", "x64"}
	macosLabels = []string{"self-hosted", "macos", "arm64"}
)

// pool is what a host offers one pool.
type pool struct {
	name  string
	slots int
}

func linux(slots int) pool { return pool{"linux", slots} }
func macos(slots int) pool { return pool{"macos", slots} }

// host is one vmagent. start fills in what is left unset: the fault script
// as its exec create and stop commands (and list, for the orphan sweep, when
// InventoryEvery is set), its control directory, short step timeouts and a
// 1 s heartbeat. ShutdownTimeout stays 0: no drain when the test stops the
// fleet.
func host(name string, physicalCap int, pools ...pool) config.Agent {
	a := config.Agent{Host: name, PhysicalCap: physicalCap, Pools: map[string]config.Pool{}}
	for _, p := range pools {
		labels := linuxLabels
		if p.name == "macos" {
			labels = macosLabels
		}
		a.Pools[p.name] = config.Pool{Labels: labels, Slots: p.slots}
	}
	return a
}

// world is one running system under test: the harness fleet, a follower
// that keeps a copy of the whole log, and the fault script's control
// directories, one per host.
type world struct {
	t      *testing.T
	ctx    context.Context
	f      *harness.Fleet
	logger *slog.Logger
	root   string // repository root
	dir    string // data dir: NATS store, agents' attempt dirs, fault control dirs
	runner string // the ghsim binary sim-runner.sh starts as a "VM"

	js  jetstream.JetStream
	app *eventlog.Appender // for facts the test appends as an operator would

	mu  sync.Mutex
	log []events.Event
}

// start runs the whole system with one host, host-a (physical cap 2, two
// linux slots), and the watchdog's deadlines short but out of the way;
// tune reshapes the fleet before it starts.
func start(t *testing.T, tune func(*config.Config)) *world {
	t.Helper()
	// Scenarios mostly wait on deadlines; each runs its own NATS, services
	// and simulator on free ports, so they share the machine.
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), testLimit)
	root, err := harness.RepoRoot()
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	w := &world{t: t, ctx: ctx, root: root, dir: t.TempDir(), logger: testLogger()}
	t.Cleanup(cancel)
	o := harness.Options{DataDir: w.dir, NATSListen: "127.0.0.1:0", Seed: 1, Timeout: testLimit, Logger: w.logger,
		Tune: func(c *config.Config) {
			w.runner = execOf(&c.Agents[0]).Env["BERTH_SIM_RUNNER"]
			c.Agents = []config.Agent{host("host-a", 2, linux(2))}
			wd := &c.Watchdog
			wd.ProvisionTimeout = 5 * time.Second
			wd.RegistrationTimeout = 30 * time.Second
			wd.TeardownTimeout = 5 * time.Second
			wd.AbandonedCap = 2
			wd.LeakGrace = 15 * time.Minute
			if tune != nil {
				tune(c)
			}
			for i := range c.Agents {
				w.complete(&c.Agents[i])
			}
		}}
	f, err := harness.Start(ctx, o)
	if err != nil {
		t.Fatalf("start the fleet: %v", err)
	}
	w.f = f
	t.Cleanup(w.stop)
	w.follow()
	return w
}

// execOf is agent a's exec section, made one if a has none yet.
func execOf(a *config.Agent) *execbe.Settings {
	e, ok := a.Backend.Settings.(*execbe.Settings)
	if !ok {
		e = &execbe.Settings{}
		a.Backend = config.Backend{Kind: execbe.Kind, Settings: e}
	}
	return e
}

// complete fills in an agent's exec backend: the fault script around
// sim-runner.sh, with the host's own control directory.
func (w *world) complete(a *config.Agent) {
	script := filepath.Join(w.root, "deploy", "exec", "faults.sh")
	e := execOf(a)
	if len(e.Create) == 0 {
		e.Create = []string{"sh", script, "create"}
	}
	if len(e.Stop) == 0 {
		e.Stop = []string{"sh", script, "stop"}
	}
	if len(e.List) == 0 && a.InventoryEvery > 0 {
		e.List = []string{"sh", script, "list"}
	}
	if e.Env == nil {
		e.Env = map[string]string{}
	}
	dir := w.faultDir(a.Host)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		w.t.Fatal(err)
	}
	e.Env["BERTH_SIM_RUNNER"] = w.runner
	e.Env["BERTH_FAULT_DIR"] = dir
	if e.CreateTimeout == 0 {
		e.CreateTimeout = 5 * time.Second
	}
	if e.StopTimeout == 0 {
		e.StopTimeout = 5 * time.Second
	}
	if e.RetryBase == 0 {
		e.RetryBase = 200 * time.Millisecond
	}
	if a.Heartbeat == 0 {
		a.Heartbeat = time.Second
	}
}

func testLogger() *slog.Logger {
	if os.Getenv("BERTH_SCENARIO_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// follow keeps a copy of the whole log, in order, for counting facts.
func (w *world) follow() {
	nc, js, err := eventlog.Connect(w.f.Sys.NATSURL, "scenario-test")
	if err != nil {
		w.t.Fatal(err)
	}
	w.js = js
	w.app = &eventlog.Appender{JS: js, Source: "berth/test", Role: events.RoleCLI} // an operator's tool
	ctx, cancel := context.WithCancel(w.ctx)
	ch := make(chan eventlog.Delivered, 256)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		_ = eventlog.Follow(ctx, js, "test-world-follow", []string{events.SubjectAll}, 1, ch)
	}()
	go func() {
		defer wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case d := <-ch:
				if d.Err == nil {
					w.mu.Lock()
					w.log = append(w.log, d.Event)
					w.mu.Unlock()
				}
			}
		}
	}()
	w.t.Cleanup(func() {
		cancel()
		wg.Wait()
		nc.Close()
	})
}

// stop shuts the fleet down, then kills runner processes it left (they run
// in their own sessions, like VMs outliving their agent).
func (w *world) stop() {
	if err := w.f.Stop(); err != nil {
		w.t.Errorf("shutdown: %v", err)
	}
	killRunners(w.dir)
}

// startAgent runs one more vmagent, outside the harness, so that the test
// can crash (stop) and restart it. The returned func stops it.
// It returns once the agent's HTTP endpoint listens; stop cancels the agent
// and waits until that endpoint is down.
func (w *world) startAgent(a config.Agent) (stop func()) {
	w.t.Helper()
	w.complete(&a)
	ctx, cancel := context.WithCancel(w.ctx)
	if err := run.GrantAgentsAt(ctx, w.f.Sys.NATSURL, []config.Agent{a}, "scenario"); err != nil {
		cancel()
		w.t.Fatalf("grant agent %s: %v", a.Host, err)
	}
	addr, err := run.Agent(ctx, w.f.Sys, w.f.Config, a, w.logger.With("agent", a.Host))
	if err != nil {
		cancel()
		w.t.Fatalf("start agent %s: %v", a.Host, err)
	}
	var once sync.Once
	w.t.Cleanup(func() { once.Do(cancel) })
	return func() {
		w.t.Helper()
		once.Do(cancel)
		w.awaitDown(addr)
	}
}

// --- the fault script's control directory ---

func (w *world) faultDir(host string) string { return filepath.Join(w.dir, "faults", host) }

// fault switches a fault on for the attempts matching the globs, e.g.
// fault("host-a", "stop-hang", "*"). The file is replaced atomically, so a
// step never reads half of it.
func (w *world) fault(host, name string, globs ...string) {
	w.t.Helper()
	dir := w.faultDir(host)
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(strings.Join(globs, "\n")+"\n"), 0o644); err != nil {
		w.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		w.t.Fatal(err)
	}
}

// clearFault switches a fault off.
func (w *world) clearFault(host, name string) {
	w.t.Helper()
	if err := os.Remove(filepath.Join(w.faultDir(host), name)); err != nil && !os.IsNotExist(err) {
		w.t.Fatal(err)
	}
}

// release makes the hanging steps of an attempt ("" for all) return and go on.
func (w *world) release(host, attempt string) {
	w.t.Helper()
	name := "release"
	if attempt != "" {
		name += "-" + attempt
	}
	if err := os.WriteFile(filepath.Join(w.faultDir(host), name), nil, 0o644); err != nil {
		w.t.Fatal(err)
	}
}

// stepCalls is what the fault script recorded for one step of one attempt.
type stepCalls struct {
	starts, ends int
	statuses     []string // exit status of each call that returned
}

// inFlight reports whether a call started and has not returned (or was killed).
func (c stepCalls) inFlight() bool { return c.starts > c.ends }

func (w *world) calls(host, step, attempt string) stepCalls {
	b, _ := os.ReadFile(filepath.Join(w.faultDir(host), "calls"))
	var c stepCalls
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != step || f[2] != attempt {
			continue
		}
		switch f[1] {
		case "start":
			c.starts++
		case "end":
			c.ends++
			if len(f) > 3 {
				c.statuses = append(c.statuses, f[3])
			}
		}
	}
	return c
}

// vms is the host's real VM inventory, as the fault script keeps it: the
// backend's truth, not Berth's fold.
func (w *world) vms(host string) []string {
	entries, _ := os.ReadDir(filepath.Join(w.faultDir(host), "vms"))
	out := []string{}
	for _, e := range entries {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

// attemptDir is the attempt's own work dir on its host.
func (w *world) attemptDir(host, attempt string) string {
	return filepath.Join(w.dir, "agents", host, "attempts", attempt)
}

// runnerAlive reports whether the attempt's simulated runner still runs: a
// live (not zombie) process whose command line names the attempt's JIT
// config file.
func (w *world) runnerAlive(host, attempt string) bool {
	needle := []byte(filepath.Join(w.attemptDir(host, attempt), "jitconfig"))
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		cmd, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(cmd, needle) {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(filepath.Dir(p), "stat"))
		if err != nil {
			continue
		}
		if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] != 'Z' {
			return true
		}
	}
	return false
}

// --- the GitHub simulator ---

func (w *world) enqueue(labels []string, d time.Duration) int64 {
	return w.f.Sim.Enqueue(ghsim.JobSpec{Labels: labels, Duration: d})
}

func jobSpec(labels []string, d time.Duration, conclusion string) ghsim.JobSpec {
	return ghsim.JobSpec{Labels: labels, Duration: d, Conclusion: conclusion}
}

func (w *world) job(id int64) ghsim.JobView {
	for _, j := range w.f.Sim.Jobs() {
		if j.ID == id {
			return j
		}
	}
	w.t.Fatalf("the simulator has no job %d", id)
	return ghsim.JobView{}
}

func (w *world) jobIs(id int64, status string) func() bool {
	return func() bool { return w.job(id).Status == status }
}

// deliverCompleted sends, through the dispatcher's real webhook intake, a
// signed "completed" delivery for a job the simulator shows in progress:
// what GitHub sends when a running job is cancelled (the simulator only
// cancels queued jobs).
func (w *world) deliverCompleted(jobID int64, conclusion string) {
	w.t.Helper()
	var body []byte
	for _, d := range w.f.Sim.Deliveries() {
		if d.JobID == jobID && d.Action == "in_progress" {
			body = d.Body
		}
	}
	if body == nil {
		w.t.Fatalf("no in_progress delivery for job %d to build a completion from", jobID)
	}
	var payload map[string]any
	if err := json.Unmarshal(body, &payload); err != nil {
		w.t.Fatal(err)
	}
	payload["action"] = "completed"
	wj := payload["workflow_job"].(map[string]any)
	wj["status"], wj["conclusion"] = "completed", conclusion
	wj["completed_at"] = time.Now().UTC().Format(time.RFC3339)
	body, _ = json.Marshal(payload)
	req, _ := http.NewRequestWithContext(w.ctx, http.MethodPost, "http://"+w.f.Sys.DispatcherAddr+"/webhook", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Event", "workflow_job")
	req.Header.Set("X-GitHub-Delivery", fmt.Sprintf("scenario-%d-%s", jobID, conclusion))
	req.Header.Set("X-Hub-Signature-256", ghsim.Sign(w.f.Config.Dispatcher.WebhookSecret, body))
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		w.t.Fatalf("deliver completed for job %d: %v", jobID, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		b, _ := io.ReadAll(resp.Body)
		w.t.Fatalf("deliver completed for job %d: %d %s", jobID, resp.StatusCode, b)
	}
}

// --- the log and the live projection ---

// facts returns the facts of a type stored so far, about one attempt
// ("" for any).
func (w *world) facts(typ, attempt string) []events.Event {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []events.Event
	for _, e := range w.log {
		if e.Type() == typ && (attempt == "" || attemptOf(e) == attempt) {
			out = append(out, e)
		}
	}
	return out
}

// jobFacts returns the facts of a type stored so far that name a job.
func (w *world) jobFacts(typ string, job int64) []events.Event {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []events.Event
	for _, e := range w.log {
		if e.Type() == typ && jobOf(e) == job {
			out = append(out, e)
		}
	}
	return out
}

func (w *world) has(typ, attempt string) func() bool {
	return func() bool { return len(w.facts(typ, attempt)) > 0 }
}

// awaitFact waits for the first fact of a type about an attempt.
func (w *world) awaitFact(typ, attempt string, within time.Duration) events.Event {
	w.t.Helper()
	w.await(typ+" for "+attempt, within, w.has(typ, attempt))
	return w.facts(typ, attempt)[0]
}

func attemptOf(e events.Event) string {
	switch d := e.Data.(type) {
	case *events.SlotReserved:
		return d.Attempt
	case *events.SlotReleased:
		return d.Attempt
	case *events.AttemptPlaced:
		return d.Attempt
	case *events.AttemptProvisioning:
		return d.Attempt
	case *events.AttemptRunnerStarted:
		return d.Attempt
	case *events.AttemptFailed:
		return d.Attempt
	case *events.AttemptTeardownRequested:
		return d.Attempt
	case *events.AttemptStopped:
		return d.Attempt
	case *events.AttemptAbandoned:
		return d.Attempt
	case *events.AttemptDeregistered:
		return d.Attempt
	case *events.AttemptBound:
		return d.Attempt
	case *events.AttemptRunnerBusy:
		return d.Attempt
	}
	return ""
}

func jobOf(e events.Event) int64 {
	switch d := e.Data.(type) {
	case *events.JobQueued:
		return d.JobID
	case *events.JobInProgress:
		return d.JobID
	case *events.JobCompleted:
		return d.JobID
	case *events.JobUnschedulable:
		return d.JobID
	case *events.SlotReserved:
		return d.JobID
	case *events.SlotReleased:
		return d.JobID
	case *events.AttemptPlaced:
		return d.JobID
	}
	return 0
}

func hostOfFact(e events.Event) string {
	switch d := e.Data.(type) {
	case *events.SlotReserved:
		return d.Host
	case *events.HostCordoned:
		return d.Host
	case *events.HostUncordoned:
		return d.Host
	case *events.HostDraining:
		return d.Host
	}
	return ""
}

// appendFact appends a fact as an operator's tool would.
func (w *world) appendFact(p events.Payload) events.Event {
	w.t.Helper()
	ev := w.app.New(time.Now(), p)
	seq, _, err := w.app.Append(w.ctx, ev, nil)
	if err != nil {
		w.t.Fatalf("append %s: %v", ev.Type(), err)
	}
	ev.Seq = seq
	return ev
}

// status is the live dispatcher's projection, read on its loop.
func (w *world) status() events.Status {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	st, err := w.f.Status(ctx)
	if err != nil {
		w.t.Fatalf("read the dispatcher's projection: %v", err)
	}
	return st
}

func poolStatus(st events.Status, name string) events.PoolStatus {
	for _, p := range st.Pools {
		if p.Name == name {
			return p
		}
	}
	return events.PoolStatus{Name: name}
}

func hostStatus(st events.Status, name string) events.HostStatus {
	for _, h := range st.Hosts {
		if h.Name == name {
			return h
		}
	}
	return events.HostStatus{Name: name}
}

// --- waiting ---

// await polls cond until it holds or within passes.
func (w *world) await(what string, within time.Duration, cond func() bool) {
	w.t.Helper()
	testkit.Poll(w.t, w.ctx, within, 25*time.Millisecond, what, func(context.Context) error {
		if cond() {
			return nil
		}
		return storyErr{w, "not yet"}
	})
}

// awaitNone polls check until it finds no problem, or fails with the last
// problems it found.
func (w *world) awaitNone(what string, within time.Duration, check func() []string) {
	w.t.Helper()
	testkit.Poll(w.t, w.ctx, within, 25*time.Millisecond, what, func(context.Context) error {
		if last := check(); len(last) > 0 {
			return storyErr{w, "\n  " + strings.Join(last, "\n  ")}
		}
		return nil
	})
}

// storyErr is a failed poll's error: its story is told only when printed.
type storyErr struct {
	w   *world
	msg string
}

func (e storyErr) Error() string { return e.msg + "\n" + e.w.story() }

// never polls cond for the whole window and fails if it ever holds.
func (w *world) never(what string, during time.Duration, cond func() bool) {
	w.t.Helper()
	for end := time.Now().Add(during); time.Now().Before(end); {
		if cond() {
			w.t.Fatalf("%s\n%s", what, w.story())
		}
		select {
		case <-w.ctx.Done():
			w.t.Fatalf("test deadline passed while checking that never: %s", what)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// story is the log and the fault scripts' calls, for a failure message.
func (w *world) story() string {
	var b strings.Builder
	b.WriteString("--- the log ---\n")
	w.mu.Lock()
	for _, e := range w.log {
		data, _ := json.Marshal(e.Data)
		if len(data) > 300 {
			data = append(data[:300], "…"...)
		}
		fmt.Fprintf(&b, "%4d %-40s %s %s\n", e.Seq, e.Type(), e.Source, data)
	}
	w.mu.Unlock()
	hosts, _ := os.ReadDir(filepath.Join(w.dir, "faults"))
	for _, h := range hosts {
		calls, _ := os.ReadFile(filepath.Join(w.dir, "faults", h.Name(), "calls"))
		fmt.Fprintf(&b, "--- fault script calls on %s ---\n%s", h.Name(), calls)
	}
	return b.String()
}

// --- closing checks ---

// checkLedger checks the books at the end of a scenario: every reservation
// released at most once in the log, the live fold's invariants hold, and a
// projection replayed from the log equals the live dispatcher's (law 9).
func (w *world) checkLedger() {
	w.t.Helper()
	released := map[string]int{}
	for _, e := range w.facts(events.TypeSlotReleased, "") {
		released[attemptOf(e)]++
	}
	for a, n := range released {
		if n != 1 {
			w.t.Errorf("slot of %s released %d times", a, n)
		}
	}
	var violations []events.Violation
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	if err := w.f.Sys.Dispatcher.Read(ctx, func(f *events.Fleet) { violations = f.Check() }); err != nil {
		w.t.Fatal(err)
	}
	if len(violations) > 0 {
		w.t.Errorf("invariants broken in the live projection: %v", violations)
	}
	// The log may grow while we compare (retried stops, demand reports):
	// compare again until both sides read the same point.
	for deadline := time.Now().Add(10 * time.Second); ; {
		ok, diff, err := w.f.ReplayEquals(w.ctx)
		if err != nil {
			w.t.Fatal(err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("a replay of the log differs from the live projection:\n%s", diff)
		}
		select {
		case <-w.ctx.Done():
			w.t.Fatal("test deadline passed comparing the replay with the live projection")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// healthz GETs a service's /healthz with a deadline: a wedged service
// fails the test by not answering.
func (w *world) healthz(addr string) (int, map[string]any) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(w.ctx, 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/healthz", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.t.Fatalf("GET %s/healthz: %v", addr, err)
	}
	defer resp.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		w.t.Fatalf("GET %s/healthz: %v", addr, err)
	}
	return resp.StatusCode, body
}

// awaitDown waits until a service's HTTP endpoint no longer answers: the
// service was stopped.
func (w *world) awaitDown(addr string) {
	w.t.Helper()
	client := &http.Client{Timeout: 500 * time.Millisecond}
	w.await(addr+" down", 10*time.Second, func() bool {
		resp, err := client.Get("http://" + addr + "/healthz")
		if err != nil {
			return true
		}
		resp.Body.Close()
		return false
	})
}

// killRunners kills the simulated runner processes a stopped fleet left
// behind (their pids are in the attempts' dirs and the fault inventories).
func killRunners(dir string) {
	var pidfiles []string
	a, _ := filepath.Glob(filepath.Join(dir, "agents", "*", "attempts", "*", "runner.pid"))
	b, _ := filepath.Glob(filepath.Join(dir, "faults", "*", "vms", "*"))
	pidfiles = append(append(pidfiles, a...), b...)
	for _, p := range pidfiles {
		raw, _ := os.ReadFile(p)
		pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
		if err != nil || pid <= 1 {
			continue
		}
		if cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && !bytes.Contains(cmd, []byte("ghsim")) {
			continue // not our runner: the pid was reused
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}
