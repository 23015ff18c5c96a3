package procs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/cli"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
	execbe "github.com/berth-ci/berth/services/vmagent/backends/exec"
	"github.com/berth-ci/berth/tests/ghsim"
)

// --- processes, through /proc ---

type procInfo struct {
	pid     int
	cmdline []byte // NUL-separated
}

// procs lists live (not zombie) processes whose environment carries the
// tag, or, with tag "", every live process.
func scanProcs(tag string) []procInfo {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var out []procInfo
	needle := []byte(tagEnv + "=" + tag + "\x00")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil || pid == os.Getpid() {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(d, "stat"))
		if err != nil {
			continue
		}
		if i := bytes.LastIndexByte(stat, ')'); i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' {
			continue
		}
		if tag != "" {
			env, err := os.ReadFile(filepath.Join(d, "environ"))
			if err != nil || !bytes.Contains(append(env, 0), needle) {
				continue
			}
		}
		cmd, _ := os.ReadFile(filepath.Join(d, "cmdline"))
		out = append(out, procInfo{pid: pid, cmdline: cmd})
	}
	return out
}

func tagged(tag string) []string {
	var out []string
	for _, p := range scanProcs(tag) {
		out = append(out, fmt.Sprintf("%d %s", p.pid, bytes.ReplaceAll(p.cmdline, []byte{0}, []byte{' '})))
	}
	return out
}

func killTagged(tag string) {
	for _, p := range scanProcs(tag) {
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
	}
}

// runnerProcs maps attempt id → live simulated runner processes ("VMs")
// started under dir: a runner's command line names its attempt's JIT config
// file, DATA/agents/HOST/attempts/ATTEMPT/jitconfig.
func runnerProcs(dir string) map[string][]string {
	out := map[string][]string{}
	for _, p := range scanProcs("") {
		args := strings.Split(string(p.cmdline), "\x00")
		for i, a := range args {
			if a == "--jitconfig-file" && i+1 < len(args) && strings.HasPrefix(args[i+1], dir) {
				path := args[i+1]
				attempt := filepath.Base(filepath.Dir(path))
				host := filepath.Base(filepath.Dir(filepath.Dir(filepath.Dir(path))))
				out[attempt] = append(out[attempt], fmt.Sprintf("%s pid %d", host, p.pid))
			}
		}
	}
	return out
}

// vmWatch samples the live VMs all along the run: two live VMs for one
// attempt id at any moment break law 4 (attempts are disjoint).
type vmWatch struct {
	dir     string
	mu      sync.Mutex
	doubled map[string][]string // attempt → the processes seen alive together
	peak    int
}

func watchVMs(dir string) *vmWatch { return &vmWatch{dir: dir, doubled: map[string][]string{}} }

func (v *vmWatch) run(ctx context.Context) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		live := runnerProcs(v.dir)
		v.mu.Lock()
		n := 0
		for a, ps := range live {
			n += len(ps)
			if len(ps) > 1 {
				v.doubled[a] = ps
			}
		}
		v.peak = max(v.peak, n)
		v.mu.Unlock()
	}
}

// --- quiescence and the verdict ---

// Progress is a one-line summary of the run, for progress lines.
func (s *System) Progress() (done, total int, line string) {
	jobs := s.Sim.Jobs()
	var queued, running int
	for _, j := range jobs {
		switch j.Status {
		case ghsim.StatusQueued:
			queued++
		case ghsim.StatusInProgress:
			running++
		case ghsim.StatusCompleted:
			done++
		}
	}
	vms := 0
	for _, ps := range runnerProcs(s.Dir) {
		vms += len(ps)
	}
	return done, len(jobs), fmt.Sprintf("jobs %d/%d done, %d running, %d queued; %d VMs alive", done, len(jobs), running, queued, vms)
}

// Quiet reports what still keeps the system from quiescence: a job neither
// completed nor given up on, a held slot, pending demand or a live VM in a
// service's projection, a VM in a host's real inventory, a runner process.
// Every running dispatcher and watchdog is asked.
func (s *System) Quiet(ctx context.Context) []string {
	var why []string
	open := 0
	for _, j := range s.Sim.Jobs() {
		if j.Status != ghsim.StatusCompleted {
			open++
		}
	}
	bases := s.liveServiceURLs()
	for _, base := range bases {
		st, err := s.Status(base)
		if err != nil {
			why = append(why, err.Error())
			continue
		}
		for _, p := range st.Pools {
			if p.Held > 0 || p.PendingDemand > 0 {
				why = append(why, fmt.Sprintf("%s: pool %s held %d, demand %d", base, p.Name, p.Held, p.PendingDemand))
			}
		}
		for _, h := range st.Hosts {
			if h.LiveVMs > 0 {
				why = append(why, fmt.Sprintf("%s: host %s has %d live VMs", base, h.Name, h.LiveVMs))
			}
		}
		// A job Berth gave up on stays queued on GitHub: it counts as settled.
		if open > 0 && open > st.Jobs.Unschedulable {
			why = append(why, fmt.Sprintf("%s: %d jobs not completed, %d unschedulable", base, open, st.Jobs.Unschedulable))
		}
	}
	for _, h := range s.Config.Agents {
		if vms, err := s.Inventory(h.Host); err != nil {
			why = append(why, err.Error())
		} else if len(vms) > 0 {
			why = append(why, fmt.Sprintf("host %s inventory lists %v", h.Host, vms))
		}
	}
	if r := runnerProcs(s.Dir); len(r) > 0 {
		why = append(why, fmt.Sprintf("runner processes alive: %v", r))
	}
	return why
}

func (s *System) liveServiceURLs() []string {
	var out []string
	for i, p := range s.Dispatchers {
		if p.Running() {
			out = append(out, s.DispatcherURLs[i])
		}
	}
	for i, p := range s.Watchdogs {
		if p.Running() {
			out = append(out, s.WatchdogURLs[i])
		}
	}
	return out
}

// AwaitQuiet waits until Quiet finds nothing, calling progress (if not nil)
// every few seconds, and fails the test with the last reasons at the deadline.
func (s *System) AwaitQuiet(within time.Duration, progress func()) {
	s.t.Helper()
	deadline := time.Now().Add(within)
	lastPrint := time.Now()
	for {
		why := s.Quiet(s.ctx)
		if len(why) == 0 {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("not quiet within %s:\n  %s", within, strings.Join(why, "\n  "))
		}
		if progress != nil && time.Since(lastPrint) >= 3*time.Second {
			lastPrint = time.Now()
			progress()
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// Inventory runs the host's exec list step, as its agent does: the VMs that
// exist on the host, by the backend's own account.
func (s *System) Inventory(host string) ([]string, error) {
	var list []string
	for _, ac := range s.Config.Agents {
		if ac.Host == host {
			if e, ok := ac.Backend.Settings.(*execbe.Settings); ok {
				list = e.List
			}
		}
	}
	if len(list) == 0 {
		return nil, fmt.Errorf("no host %s with a list step", host)
	}
	ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, list[0], list[1:]...)
	cmd.Env = append(os.Environ(), "BERTH_STEP=list", "BERTH_FAULT_DIR="+s.FaultDir(host),
		"BERTH_ATTEMPTS_DIR="+filepath.Join(s.Config.DataDir, "agents", host, "attempts"))
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("list step on %s: %w", host, err)
	}
	return strings.Fields(string(out)), nil
}

// Creates counts, per attempt id, the create steps the hosts' fault scripts
// recorded starting (across every host).
func (s *System) Creates() map[string]int {
	out := map[string]int{}
	for _, a := range s.Config.Agents {
		b, _ := os.ReadFile(filepath.Join(s.FaultDir(a.Host), "calls"))
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 3 && f[0] == "create" && f[1] == "start" {
				out[f[2]]++
			}
		}
	}
	return out
}

// Verify checks, once the system is quiet, that the fleet healed:
//   - every job was served exactly once by one of Berth's runners (one
//     completion, one in_progress runner, no runner ran two jobs), or Berth
//     gave up on it with a reason (unschedulable);
//   - no slot is held and no VM is alive, in the log, in every live
//     service's projection, in each host's real inventory, as processes or
//     as attempt work directories;
//   - no attempt id ever had two live VMs, nor two create steps;
//   - the log keeps the fleet's invariants, and `berth replay --check`
//     (cli.Check) finds no difference on any live dispatcher or watchdog.
func (s *System) Verify() {
	t := s.t
	t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
	defer cancel()
	fleet, err := s.Replay(ctx)
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	unschedulable := s.verifyJobs(fleet)
	s.verifyEmpty("replay", fleet.Status())
	for _, v := range fleet.Check() {
		t.Errorf("invariant broken in the log: %s\n%s", v, s.factsNaming(ctx, v.Subject))
	}
	s.verifyServices(ctx)
	s.verifyHosts()
	s.verifyAttemptsDisjoint()
	for _, p := range s.Procs() {
		if u := p.Unexpected(); u != "" {
			t.Errorf("%s", u)
		}
	}
	t.Logf("verified: %d jobs (%d unschedulable), %d attempts, %d events", len(s.Sim.Jobs()), unschedulable, len(fleet.Attempts), fleet.LastSeq)
}

// factsNaming lists, one a line, the stored facts whose payload names id
// (an attempt, a pool or a host): their sequence, subject, type, source,
// time and payload, so that a broken invariant shows which authors wrote
// what, in log order.
func (s *System) factsNaming(ctx context.Context, id string) string {
	var b strings.Builder
	needle := strconv.Quote(id)
	_, err := eventlog.Scan(ctx, s.js, events.SubjectAll, 1, 0, func(d eventlog.Delivered) error {
		if d.Event.Data == nil {
			return nil
		}
		body, err := json.Marshal(d.Event.Data)
		if err != nil || !bytes.Contains(body, []byte(needle)) {
			return nil
		}
		fmt.Fprintf(&b, "  seq %d %s %s id %s from %s at %s: %s\n", d.Event.Seq, d.Event.Subject, d.Event.Type(),
			d.Event.ID, d.Event.Source, d.Event.Time.Format("15:04:05.000"), body)
		return nil
	})
	if err != nil {
		fmt.Fprintf(&b, "  (the log's facts could not be read: %v)\n", err)
	}
	return b.String()
}

// dumpRefused prints, for each attempt some service refused a fact about,
// every stored fact that names the attempt: what the log held before the
// refusal and after it. At most three attempts, each read within 20 s.
func (s *System) dumpRefused() {
	var logs []string
	for _, p := range s.Procs() {
		logs = append(logs, p.Log)
	}
	ids := refusedAttempts(logs)
	for _, id := range ids[:min(len(ids), 3)] {
		ctx, cancel := context.WithTimeout(s.ctx, 20*time.Second)
		s.t.Logf("--- the log's facts about attempt %s, which a service refused a fact about:\n%s", id, s.factsNaming(ctx, id))
		cancel()
	}
}

// refusedAttempts is, sorted, every attempt whose subject a "fact refused"
// line of the logs at paths names.
func refusedAttempts(paths []string) []string {
	ids := map[string]bool{}
	for _, path := range paths {
		for _, line := range strings.Split(marked(path, [][]byte{[]byte("fact refused")}, 10), "\n") {
			if _, rest, ok := strings.Cut(line, `"subject":"`+events.SubjectPrefix+`.attempt.`); ok {
				if parts := strings.SplitN(rest, ".", 3); len(parts) == 3 {
					ids[parts[1]] = true // host, attempt, role
				}
			}
		}
	}
	return slices.Sorted(maps.Keys(ids))
}

// verifyJobs checks that GitHub and the log agree each job was served
// exactly once by one of Berth's runners, or given up on with a reason; it
// returns how many were given up on.
func (s *System) verifyJobs(fleet *events.Fleet) (unschedulable int) {
	t := s.t
	t.Helper()
	runners := map[string]int64{}
	for _, j := range s.Sim.Jobs() {
		fj := fleet.Jobs[j.ID]
		switch {
		case j.Status == ghsim.StatusCompleted && j.Completions == 1 && strings.HasPrefix(j.RunnerName, "berth-"):
			if other, ok := runners[j.RunnerName]; ok {
				t.Errorf("runner %s ran two jobs: %d and %d", j.RunnerName, other, j.ID)
			}
			runners[j.RunnerName] = j.ID
			if fj == nil || fj.Status != events.StatusCompleted || fj.Runner != j.RunnerName {
				t.Errorf("job %d: GitHub says completed by %s, the log says %+v", j.ID, j.RunnerName, fj)
			}
		case fj != nil && fj.Unschedulable && fj.UnschedulableReason != "":
			unschedulable++
			t.Logf("job %d marked unschedulable: %s", j.ID, fj.UnschedulableReason)
		default:
			t.Errorf("job %d not served exactly once: status %s, %d completions, runner %q; log: %+v",
				j.ID, j.Status, j.Completions, j.RunnerName, fj)
		}
	}
	return unschedulable
}

// verifyEmpty checks that one view of the fleet (the replay's, or a live
// service's) holds no slot and counts no live VM.
func (s *System) verifyEmpty(where string, st events.Status) {
	t := s.t
	t.Helper()
	for _, p := range st.Pools {
		if p.Held != 0 {
			t.Errorf("%s: pool %s holds %d slots: %+v", where, p.Name, p.Held, p.HeldBy)
		}
	}
	for _, h := range st.Hosts {
		if h.LiveVMs != 0 {
			t.Errorf("%s: host %s has %d live VMs", where, h.Name, h.LiveVMs)
		}
	}
}

// verifyServices checks every live dispatcher and watchdog: its projection
// is empty and equals a replay of the log (`berth replay --check`).
func (s *System) verifyServices(ctx context.Context) {
	t := s.t
	t.Helper()
	for _, base := range s.liveServiceURLs() {
		// Compare only a service that says it has read the log up to where
		// it stood when it (re)started (law 11): one restarted a moment ago
		// may still wait for its killed predecessor's pull requests to
		// expire before it takes its consumer back (about 5 s).
		testkit.EventuallyErr(t, 60*time.Second, base+" caught up (/healthz 200)", func() error {
			c := &http.Client{Timeout: 2 * time.Second}
			resp, err := c.Get(base + "/healthz")
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("/healthz %d", resp.StatusCode)
			}
			return nil
		})
		live, err := s.Status(base)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		s.verifyEmpty(base, live)
		diffs, seq, err := cli.Check(ctx, s.js, base, nil)
		if err != nil {
			t.Errorf("replay --check %s: %v", base, err)
		} else if len(diffs) > 0 {
			t.Errorf("replay --check %s: %d differences at seq %d:\n  %s", base, len(diffs), seq, strings.Join(diffs, "\n  "))
		}
	}
}

// verifyHosts checks that nothing of a VM is left on any host: not in its
// backend's inventory, not as an attempt work directory, not as a runner
// process.
func (s *System) verifyHosts() {
	t := s.t
	t.Helper()
	for _, a := range s.Config.Agents {
		if vms, err := s.Inventory(a.Host); err != nil || len(vms) > 0 {
			t.Errorf("host %s inventory: %v %v", a.Host, vms, err)
		}
		dirs, _ := os.ReadDir(filepath.Join(s.Config.DataDir, "agents", a.Host, "attempts"))
		for _, d := range dirs {
			t.Errorf("host %s: attempt work dir %s left", a.Host, d.Name())
		}
	}
	if r := runnerProcs(s.Dir); len(r) > 0 {
		t.Errorf("runner processes alive: %v", r)
	}
}

// verifyAttemptsDisjoint checks law 4 over the whole run: no attempt id
// ever had two live VMs at once (as sampled), nor two create steps.
func (s *System) verifyAttemptsDisjoint() {
	t := s.t
	t.Helper()
	s.vms.mu.Lock()
	for a, ps := range s.vms.doubled {
		t.Errorf("attempt %s had two live VMs at once: %v", a, ps)
	}
	s.vms.mu.Unlock()
	var twice []string
	for a, n := range s.Creates() {
		if n > 1 {
			twice = append(twice, fmt.Sprintf("%s (%d)", a, n))
		}
	}
	sort.Strings(twice)
	if len(twice) > 0 {
		t.Errorf("attempts created more than once: %v", twice)
	}
}
