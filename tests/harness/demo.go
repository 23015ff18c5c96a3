package harness

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/tests/ghsim"
)

// Report is the outcome of a run.
type Report struct {
	Jobs         int
	Served       int // completed exactly once, by one of Berth's runners
	Failed       int // not completed, completed twice, or by a runner not ours
	Conclusions  map[string]int
	QueueToStart []time.Duration // queued → a runner took it, per served job
	// WarmHits and ColdStarts split the served jobs: on a VM booted before
	// the job (a warm pool's) or on one booked for it; with their queued →
	// runner-took-it times.
	WarmHits, ColdStarts          int
	QueueToStartWarm, QueueToCold []time.Duration
	WarmIdle                      int // warm VMs booting or idle at the end: the pools' targets, not leftovers
	SlotsHeld                     int
	VMsAlive                      int // live VMs in the fold plus attempt dirs left on the agents
	Attempts                      int
	Events                        uint64
	ReplayEqual                   bool   // a fresh replay of the log equals the live dispatcher's projection
	ReplayDiff                    string // when not equal
	Violations                    []events.Violation
	Elapsed                       time.Duration
	// Interrupted: the run was cut short (Ctrl-C) before every job was
	// served; TimedOut: it gave up after Options.Timeout. Unfinished jobs
	// were not completed then (Queued of them still waiting, Running on a
	// runner); they count as not served.
	// Intakes splits the served jobs by how they reached Berth:
	// "webhooks" or "scale set".
	Intakes map[string]*IntakeReport
	// ScaleSetPools are the pools served through scale sets (the rest
	// through webhooks), for the summary's labels.
	ScaleSetPools []string

	Interrupted, TimedOut bool
	Unfinished            int
	Queued, Running       int
	NATSURL               string
	Dispatcher            string // base URLs of the live services, for berth replay --check
	Watchdog              string
}

// IntakeReport is the served jobs of one intake and their queued →
// runner-took-it times.
type IntakeReport struct {
	Served       int
	QueueToStart []time.Duration
}

// times is "p50 X, p99 Y" of ds, or "none" without samples.
func times(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	return fmt.Sprintf("p50 %s, p99 %s", Percentile(ds, 50).Round(time.Millisecond), Percentile(ds, 99).Round(time.Millisecond))
}

// intakeOf names how a job reached Berth.
func intakeOf(j ghsim.JobView) string {
	if j.ScaleSet != 0 {
		return "scale set"
	}
	return "webhooks"
}

// OK is the demo's verdict: every job served once, nothing left held or alive.
func (r Report) OK() bool {
	return r.Served == r.Jobs && r.Failed == 0 && r.SlotsHeld == 0 && r.VMsAlive == 0 && r.ReplayEqual && len(r.Violations) == 0
}

// Percentile returns the p-th percentile (0..100) of ds.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(float64(len(s)-1) * p / 100)
	return s[i]
}

// Run starts a fleet, feeds it the job plan, waits until every job is done
// and every slot and VM is back (or the timeout), and reports.
func Run(ctx context.Context, o Options) (Report, error) {
	start := time.Now()
	f, err := Start(ctx, o)
	if err != nil {
		return Report{}, err
	}
	rep, runErr := f.Drive(ctx, o)
	stopErr := f.Stop()
	rep.Elapsed = time.Since(start)
	if runErr != nil {
		return rep, runErr
	}
	return rep, stopErr
}

// Drive enqueues the plan and waits for the fleet to settle.
func (f *Fleet) Drive(ctx context.Context, o Options) (Report, error) {
	plan := JobPlan(o)
	rep := Report{Jobs: len(plan), NATSURL: f.Sys.NATSURL, Conclusions: map[string]int{},
		Dispatcher: "http://" + f.Sys.DispatcherAddr, Watchdog: "http://" + f.Sys.WatchdogAddr}
	deadline := time.Now().Add(o.Timeout)
	gap := time.Duration(0)
	if len(plan) > 1 {
		gap = o.Arrival / time.Duration(len(plan))
	}
	if err := f.awaitHosts(ctx, o.Progress); err != nil {
		if ctx.Err() != nil {
			return f.interrupted(ctx, rep)
		}
		return rep, err
	}
	next := time.Now()
	enqueued := 0
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	lastPrint := time.Time{}
	for {
		for enqueued < len(plan) && !time.Now().Before(next) {
			f.Sim.Enqueue(plan[enqueued])
			enqueued++
			next = next.Add(gap)
		}
		if ctx.Err() != nil {
			return f.interrupted(ctx, rep)
		}
		st, err := f.Status(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return f.interrupted(ctx, rep)
			}
			return rep, err
		}
		jobs := f.Sim.Jobs()
		done := enqueued == len(plan) && allCompleted(jobs) && settled(st)
		if o.Progress != nil && (done || time.Since(lastPrint) >= time.Second) {
			lastPrint = time.Now()
			fmt.Fprintln(o.Progress, progressLine(jobs, len(plan), st))
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "timed out after %s waiting for the fleet to settle; status follows\n", o.Timeout)
			rep.TimedOut = true
			break
		}
		select {
		case <-ctx.Done():
			return f.interrupted(ctx, rep)
		case <-tick.C:
		}
	}
	return f.report(ctx, rep)
}

// awaitHosts waits until the dispatcher's projection holds every agent of
// the fleet's config, so the first progress line counts the whole fleet's
// slots (a new user read "linux 0/4" of 8 as a fault). It fails after 30 s,
// naming the hosts still missing.
func (f *Fleet) awaitHosts(ctx context.Context, progress io.Writer) error {
	want := map[string]bool{}
	for _, a := range f.Config.Agents {
		want[a.Host] = true
	}
	deadline := time.Now().Add(30 * time.Second)
	for said := false; ; said = true {
		st, err := f.Status(ctx)
		if err != nil {
			return err
		}
		var missing []string
		for h := range want {
			if !slices.ContainsFunc(st.Hosts, func(hs events.HostStatus) bool { return hs.Name == h }) {
				missing = append(missing, h)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		sort.Strings(missing)
		if time.Now().After(deadline) {
			return fmt.Errorf("hosts %s did not register within 30 s: see their agents' logs (-v)", strings.Join(missing, ", "))
		}
		if !said && progress != nil {
			fmt.Fprintf(progress, "waiting for hosts %s to register before queueing jobs…\n", strings.Join(missing, ", "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// interrupted reports a run cut short: what happened so far, within
// seconds (no replay of the log), on a context of its own (the fleet runs
// until Stop, whatever ctx does).
func (f *Fleet) interrupted(ctx context.Context, rep Report) (Report, error) {
	rep.Interrupted = true
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return f.report(rctx, rep)
}

func allCompleted(jobs []ghsim.JobView) bool {
	for _, j := range jobs {
		if j.Status != "completed" {
			return false
		}
	}
	return true
}

// settled: no slot held, no VM alive, no job waiting in the projection,
// but for warm pools' VMs waiting for jobs (idle; none still booting).
func settled(st events.Status) bool {
	warm, live := 0, 0
	for _, p := range st.Pools {
		if p.Held-p.WarmIdle > 0 || p.PendingDemand > 0 {
			return false
		}
		warm += p.WarmIdle
	}
	for _, h := range st.Hosts {
		live += h.LiveVMs
	}
	return live <= warm
}

func progressLine(jobs []ghsim.JobView, total int, st events.Status) string {
	var queued, running, done int
	for _, j := range jobs {
		switch j.Status {
		case "queued":
			queued++
		case "in_progress":
			running++
		case "completed":
			done++
		}
	}
	var pools []string
	for _, p := range st.Pools {
		pools = append(pools, fmt.Sprintf("%s %d/%d", p.Name, p.Held, p.Capacity))
	}
	vms, phys := 0, 0
	for _, h := range st.Hosts {
		vms += h.LiveVMs
		phys += h.PhysicalCap
	}
	return fmt.Sprintf("[%s] queued %3d  running %3d  done %3d/%d  slots held: %s  VMs alive %d/%d (physical cap; includes VMs being torn down)",
		time.Now().Format("15:04:05"), queued, running, done, total, strings.Join(pools, ", "), vms, phys)
}

func (f *Fleet) report(ctx context.Context, rep Report) (Report, error) {
	if f.Config.Dispatcher.GitHub.Intake == config.IntakeScaleSet {
		rep.ScaleSetPools = f.Config.Dispatcher.GitHub.ScaleSet.Pools
	}
	var live *events.Fleet
	var liveStatus events.Status
	err := f.Sys.Dispatcher.Read(ctx, func(fl *events.Fleet) {
		liveStatus = fl.Status()
		live = fl
		rep.Attempts = len(fl.Attempts)
		rep.Events = fl.LastSeq
		rep.Violations = fl.Check()
	})
	if err != nil {
		return rep, err
	}
	for _, j := range f.Sim.Jobs() {
		ours := strings.HasPrefix(j.RunnerName, "berth-")
		if j.Status == "completed" && j.Completions == 1 && ours {
			rep.Served++
			rep.Conclusions[j.Conclusion]++
			rep.QueueToStart = append(rep.QueueToStart, j.StartedAt.Sub(j.QueuedAt))
			if rep.Intakes == nil {
				rep.Intakes = map[string]*IntakeReport{}
			}
			in := rep.Intakes[intakeOf(j)]
			if in == nil {
				in = &IntakeReport{}
				rep.Intakes[intakeOf(j)] = in
			}
			in.Served++
			in.QueueToStart = append(in.QueueToStart, j.StartedAt.Sub(j.QueuedAt))
			if strings.HasPrefix(j.RunnerName, "berth-warm-") {
				rep.WarmHits++
				rep.QueueToStartWarm = append(rep.QueueToStartWarm, j.StartedAt.Sub(j.QueuedAt))
			} else {
				rep.ColdStarts++
				rep.QueueToCold = append(rep.QueueToCold, j.StartedAt.Sub(j.QueuedAt))
			}
		} else {
			rep.Failed++
		}
		switch j.Status {
		case "queued":
			rep.Unfinished++
			rep.Queued++
		case "in_progress":
			rep.Unfinished++
			rep.Running++
		case "completed":
		default:
			rep.Unfinished++
		}
	}
	// A warm pool's VMs that wait for jobs are its target, not leftovers.
	warmFree := map[string]bool{}
	for id, a := range live.Attempts {
		if a.WarmFree() {
			warmFree[id] = true
		}
	}
	for _, p := range liveStatus.Pools {
		rep.SlotsHeld += p.Held - p.WarmWarming - p.WarmIdle
		rep.WarmIdle += p.WarmWarming + p.WarmIdle
	}
	// A VM left behind shows in the fold (live), on disk (its attempt's
	// directory), or both: count each host's larger figure, not their sum
	// (a VM in both was counted twice), and not the free warm VMs.
	warmLive := map[string]int{}
	for id := range warmFree {
		if a := live.Attempts[id]; a != nil && a.VMLive() {
			warmLive[a.Host]++
		}
	}
	for _, h := range liveStatus.Hosts {
		onDisk := 0
		dirs, _ := os.ReadDir(filepath.Join(f.Config.DataDir, "agents", h.Name, "attempts"))
		for _, d := range dirs {
			if !warmFree[d.Name()] {
				onDisk++
			}
		}
		rep.VMsAlive += max(h.LiveVMs-warmLive[h.Name], onDisk)
	}
	if rep.Interrupted {
		return rep, nil // a replay of a busy log would keep the operator waiting
	}
	rep.ReplayEqual, rep.ReplayDiff, err = f.ReplayEquals(ctx)
	return rep, err
}

// ReplayEquals rebuilds the projection from the log, as a restarted
// dispatcher would, and compares its status with the live dispatcher's.
func (f *Fleet) ReplayEquals(ctx context.Context) (bool, string, error) {
	closeNC, js, err := eventlog.Connect(f.Sys.NATSURL, "berth-replay-check")
	if err != nil {
		return false, "", err
	}
	defer closeNC.Close()
	// Wait for the live fold to reach the end of the log first.
	var last uint64
	if last, err = eventlog.LastSeq(ctx, js); err != nil {
		return false, "", err
	}
	var live events.Status
	for deadline := time.Now().Add(10 * time.Second); ; {
		var seq uint64
		if err := f.Sys.Dispatcher.Read(ctx, func(fl *events.Fleet) { seq, live = fl.LastSeq, fl.Status() }); err != nil {
			return false, "", err
		}
		if seq >= last {
			break
		}
		if time.Now().After(deadline) {
			return false, "", fmt.Errorf("live dispatcher stuck at seq %d of %d", seq, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
	replayed, err := eventlog.Replay(ctx, js, nil)
	if err != nil {
		return false, "", err
	}
	fresh := replayed.Status()
	if fresh.AsOfSeq != live.AsOfSeq {
		// The log grew after we read it; compare up to the same point only
		// when it did not.
		return false, fmt.Sprintf("replay at seq %d, live at %d", fresh.AsOfSeq, live.AsOfSeq), nil
	}
	if !reflect.DeepEqual(fresh, live) {
		return false, fmt.Sprintf("replayed %+v\nlive %+v", fresh, live), nil
	}
	return true, "", nil
}

// DefaultNATSURL is where the demo's embedded NATS listens unless told
// otherwise (-nats-listen).
const DefaultNATSURL = "nats://127.0.0.1:4222"

// PrintSummary writes the demo's closing summary; keep says whether the
// system stays up for the operator to look in.
func PrintSummary(w io.Writer, r Report, keep bool) {
	fmt.Fprintln(w)
	fmt.Fprintln(w, "=== Berth demo summary ===")
	fmt.Fprintf(w, "jobs served:            %d of %d (job outcomes: %d success, %d failure as the workload planned)\n",
		r.Served, r.Jobs, r.Conclusions["success"], r.Conclusions["failure"])
	fmt.Fprintf(w, "jobs not served:        %d", r.Failed)
	if r.Unfinished > 0 {
		fmt.Fprintf(w, " (%d unfinished: %d queued, %d running)", r.Unfinished, r.Queued, r.Running)
	}
	if notSent := r.Jobs - r.Served - r.Failed; notSent > 0 {
		fmt.Fprintf(w, "; %d not yet sent by the simulator", notSent)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "queued → runner online: %s\n", times(r.QueueToStart))
	fmt.Fprintf(w, "  warm hits:            %d jobs, %s (on a VM booted before the job)\n", r.WarmHits, times(r.QueueToStartWarm))
	fmt.Fprintf(w, "  cold starts:          %d jobs, %s (VM booked and booted for the job)\n", r.ColdStarts, times(r.QueueToCold))
	sets := strings.Join(r.ScaleSetPools, ", ")
	for _, name := range []string{"webhooks", "scale set"} {
		if in := r.Intakes[name]; in != nil && (len(r.Intakes) > 1 || name == "scale set") {
			label := "through webhooks (the other pools)"
			if name == "scale set" {
				label = "through scale set (" + sets + ")"
			}
			fmt.Fprintf(w, "  %s: %d jobs, %s\n", label, in.Served, times(in.QueueToStart))
		}
	}
	fmt.Fprintf(w, "warm VMs idle at end:   %d (kept for the warm pools' targets; they hold slots of their own)\n", r.WarmIdle)
	fmt.Fprintf(w, "slots held at the end:  %d (not counting the idle warm VMs')\n", r.SlotsHeld)
	fmt.Fprintf(w, "VMs alive at the end:   %d (not counting the idle warm VMs)\n", r.VMsAlive)
	fmt.Fprintf(w, "attempts:               %d; events in the log: %d\n", r.Attempts, r.Events)
	if r.Interrupted {
		fmt.Fprintln(w, "replay equals live:     not checked (interrupted)")
	} else {
		fmt.Fprintf(w, "replay equals live:     %v %s\n", r.ReplayEqual, r.ReplayDiff)
	}
	if len(r.Violations) > 0 {
		fmt.Fprintf(w, "invariant violations:   %v\n", r.Violations)
	}
	fmt.Fprintf(w, "elapsed:                %s\n", r.Elapsed.Round(100*time.Millisecond))
	fmt.Fprintln(w)
	natsURL := r.NATSURL
	if keep {
		fmt.Fprintln(w, "The system is still running (-keep). Look in from another terminal (make tools installs ./bin/nats):")
	} else {
		flags := "-keep"
		if natsURL != DefaultNATSURL {
			// A free port picked for this run (4222 was taken): the next
			// run needs the same flag, and will pick another port.
			flags, natsURL = "'-keep -nats-listen=127.0.0.1:0'", "<the NATS URL it prints>"
		}
		fmt.Fprintf(w, "To look in afterwards, run `make demo DEMO_FLAGS=%s`; then, from another terminal (make tools installs ./bin/nats):\n", flags)
	}
	fmt.Fprintf(w, "  ./bin/nats --server %s stream info BERTH_EVENTS\n", natsURL)
	fmt.Fprintf(w, "  ./bin/nats --server %s stream subjects BERTH_EVENTS 'berth.evt.job.>'   # job ids\n", natsURL)
	fmt.Fprintf(w, "  go run ./services/cmd/berth --nats %s status\n", natsURL)
	fmt.Fprintf(w, "  go run ./services/cmd/berth --nats %s events --job <job id>\n", natsURL)
	dispatcher, watchdog := r.Dispatcher, r.Watchdog
	if !keep {
		// Their ports are picked afresh each run: the -keep run prints its own.
		dispatcher, watchdog = "<dispatcher address it prints>", "<watchdog address it prints>"
	}
	fmt.Fprintf(w, "  go run ./services/cmd/berth --nats %s replay --check --service %s --service %s\n", natsURL, dispatcher, watchdog)
	switch {
	case r.Interrupted:
		fmt.Fprintf(w, "RESULT: INTERRUPTED after %s: %d of %d jobs served, %d unfinished, %d not yet sent (their slots and VMs end with the system)\n",
			r.Elapsed.Round(100*time.Millisecond), r.Served, r.Jobs, r.Unfinished, max(r.Jobs-r.Served-r.Failed, 0))
	case r.TimedOut:
		fmt.Fprintf(w, "RESULT: TIMED OUT: %d of %d jobs served, %d unfinished, %d slots held, %d VMs alive; rerun with -keep and "+
			"look at the page or `berth status` and `berth events --job <id>` for what waits (or raise -timeout if the fleet was only slow)\n",
			r.Served, r.Jobs, r.Unfinished, r.SlotsHeld, r.VMsAlive)
	case r.OK():
		fmt.Fprintln(w, "RESULT: OK")
	default:
		fmt.Fprintln(w, "RESULT: FAILED (jobs not served, or slots/VMs left): rerun with --log-level debug and read `berth events`")
	}
}
