package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"runtime/trace"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/tests/ghsim"
)

// Env is what every phase shares.
type Env struct {
	Fixtures string
	Logger   *slog.Logger
	Seed     uint64
	// Timeout bounds each phase's main wait; Stall fails it sooner when
	// nothing moves for that long.
	Timeout, Stall time.Duration
	// BareLabel adds jobs whose runs-on is just "self-hosted" (either pool's
	// runners may take them) to every workload.
	BareLabel bool
	// Progress receives one line per step; nil for none.
	Progress func(format string, args ...any)
	// Unloaded, when set, receives the dispatch latency phase's figure at
	// its lowest rate, for the scale phase to compare with.
	Unloaded *Unloaded
	// HookSenders is how many webhook deliveries the simulator has in
	// flight at once (0: one at a time, in order).
	HookSenders int
	// JITFile makes the bench's VMs read their JIT config from the file the
	// agent writes, as exec and vz do; otherwise they take it in memory, as
	// ec2 does (backend.InMemoryJIT), and the agent touches no disk per VM.
	JITFile bool
	// World, when not empty, is the command line that starts the world
	// process (world.go: the bench binary's `world` mode). The scale phase
	// then runs the simulator and the agents there, apart from the control
	// plane, as GitHub and the hosts are in production, on at most
	// WorldProcs cores (0: every core).
	World      []string
	WorldProcs int
}

// Unloaded is dispatch latency with the fleet nearly idle.
type Unloaded struct {
	Rate int
	Dist Dist
	// Reserve is the part before the GitHub call: webhook accepted → slot
	// reserved stored.
	Reserve Dist
}

func (e Env) say(format string, args ...any) {
	if e.Progress != nil {
		e.Progress(format, args...)
	}
}

// every says what report returns each period until the returned stop is
// called: a long phase shows its progress.
func (e Env) every(period time.Duration, report func()) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				report()
			}
		}
	}()
	return func() { close(done) }
}

// jitHandOver says how the bench's VMs get their JIT configs.
func (e Env) jitHandOver() string {
	if e.JITFile {
		return "the agents write each VM's JIT config to a file in its own directory, as for exec and vz (-jit-file)"
	}
	return "the VMs take their JIT configs in memory, as ec2 does: the agents write no file per VM (-jit-file writes one, as for exec and vz)"
}

// senders says how the simulator delivers webhooks.
func (e Env) senders() string {
	if e.HookSenders <= 1 {
		return "the simulator delivers webhooks one at a time, in order (-hook-senders 1)"
	}
	return fmt.Sprintf("the simulator has up to %d webhook deliveries in flight, each job's in order (-hook-senders %d; GitHub delivers concurrently)",
		e.HookSenders, e.HookSenders)
}

func (e Env) fleet(ctx context.Context, o FleetOptions) (*Fleet, error) {
	o.Fixtures, o.Logger, o.HookSenders, o.JITFile = e.Fixtures, e.Logger, e.HookSenders, e.JITFile
	return StartFleet(ctx, o)
}

// run starts a counter at the end of the log, enqueues specs through feed,
// waits for done, and returns the stored facts of the run.
type runOut struct {
	base, last uint64
	log        []Stored
	tl         Timeline
	start      time.Time // first enqueue
	enqueued   time.Time // last enqueue
}

// feed says how jobs are offered: all at once, at a rate, or with at most
// limit of them unfinished.
type feed struct {
	rate  float64 // jobs per second; 0 with limit 0: as fast as the sim takes them
	limit int64   // max jobs enqueued and not completed; 0 for no limit
	// onStart, when set, is handed the run's counter before the first
	// enqueue (the throughput phase profiles the run a tenth at a time).
	onStart func(*Counter)
}

func (e Env) drive(ctx context.Context, phase string, f *Fleet, specs []ghsim.JobSpec, fd feed, done func(c *Counter) bool) (runOut, error) {
	var out runOut
	var err error
	if out.base, err = LastSeq(ctx, f.JS); err != nil {
		return out, err
	}
	c, err := Count(ctx, f.JS, out.base+1)
	if err != nil {
		return out, err
	}
	defer c.Stop()
	n := int64(len(specs))
	status := func() string {
		total, last := c.Total()
		return fmt.Sprintf("%d of %d jobs completed; log: %d queued, %d reserved, %d placed, %d released, %d stopped, %d facts, the last %s ago; runner failures %d",
			c.Get(events.TypeJobCompleted), n, c.Get(events.TypeJobQueued), c.Get(events.TypeSlotReserved), c.Get(events.TypeAttemptPlaced),
			c.Get(events.TypeSlotReleased), c.Get(events.TypeAttemptStopped), total, time.Since(last).Round(time.Millisecond), f.RunnerFailures())
	}
	progress := func() int64 { t, _ := c.Total(); return t }
	if fd.onStart != nil {
		fd.onStart(c)
	}
	out.start = time.Now()
	deadline := out.start.Add(e.Timeout)
	defer e.every(30*time.Second, func() { e.say("%s: %s", phase, status()) })()
	for i := range specs {
		if fd.rate > 0 {
			due := out.start.Add(time.Duration(float64(i) / fd.rate * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
		}
		if fd.limit > 0 {
			for int64(i)-c.Get(events.TypeJobCompleted) >= fd.limit {
				if time.Now().After(deadline) || ctx.Err() != nil {
					return out, fmt.Errorf("phase %s: feeding stuck at job %d: %s", phase, i, status())
				}
				time.Sleep(time.Millisecond)
			}
		}
		f.Sim.Enqueue(specs[i])
	}
	out.enqueued = time.Now()
	if err := Wait(ctx, phase, e.Timeout, e.Stall, func() bool { return done(c) }, progress, status); err != nil {
		return out, fmt.Errorf("%w\n%s", err, diagnose(ctx, f))
	}
	if err := c.Err(); err != nil {
		return out, fmt.Errorf("phase %s: log follower: %w", phase, err)
	}
	if out.last, err = LastSeq(ctx, f.JS); err != nil {
		return out, err
	}
	if out.log, err = ReadLog(ctx, f.JS, out.base+1, out.last, time.Minute); err != nil {
		return out, err
	}
	out.tl = BuildTimeline(out.log)
	return out, nil
}

func settled(n int) func(*Counter) bool { return func(c *Counter) bool { return c.Settled(int64(n)) } }

// ThroughputOptions size the throughput phase.
type ThroughputOptions struct {
	Jobs, Hosts int
	CPUProfile  string // write a CPU profile of the run here when not ""
}

// Throughput enqueues jobs of zero duration as fast as the simulator takes
// them and measures whole lifecycles per second (queued → completed, slot
// released, VM stopped) through every service, beside the raw JetStream
// async-publish rate on the same server divided by the events a job costs.
func Throughput(ctx context.Context, e Env, o ThroughputOptions) (Result, error) {
	res := Result{Phase: "throughput"}
	// The simulator remembers the webhooks of the jobs that can be open at
	// once (three a job), not every one of the run.
	f, err := e.fleet(ctx, FleetOptions{Hosts: o.Hosts, LinuxSlots: 64, MacSlots: 32, KeepDeliveries: 3 * throughputBacklog})
	if err != nil {
		return res, err
	}
	defer f.Close()
	specs := Workload(o.Jobs, e.Seed, 0.3, 0, 0, e.BareLabel)
	e.say("throughput: %d jobs of zero duration on %d hosts (64 linux + 32 macos slots each)", o.Jobs, o.Hosts)
	// Always profiled, a tenth at a time: the samples say whose the CPU
	// was, and the first and last tenths' say what a slower end cost.
	var tp *tenths
	fd := feed{onStart: func(c *Counter) { tp = profileTenths(c, o.Jobs) }}
	if o.Jobs > throughputBacklog {
		// A long run grows the history, not the queue: at most this many
		// jobs wait or run at once, so flatness measures the cost of what
		// the folds keep.
		fd.limit = throughputBacklog
	}
	cpuBefore := processCPU()
	run, err := e.drive(ctx, "throughput", f, specs, fd, settled(o.Jobs))
	cpu := processCPU() - cpuBefore
	var parts []tenth
	if tp != nil {
		parts = tp.Stop()
	}
	if err != nil {
		return res, err
	}
	var shares CPUShares
	var byTenth []string
	if tp != nil {
		if shares, byTenth, err = readTenths(parts, o.CPUProfile); err != nil {
			return res, err
		}
	}
	facts := float64(run.last - run.base)
	elapsed := run.tl.LastRelease.Sub(run.start)
	jobsPerSec := rate(float64(o.Jobs), elapsed)
	perJob := facts / float64(o.Jobs)
	size := run.tl.Bytes / max(len(run.log), 1)
	e.say("throughput: %.1f jobs/s, %.1f facts/job of %d bytes on average; measuring raw publishes", jobsPerSec, perJob, size)
	n := min(max(20000, int(2*facts)), 200000) // a rate, not a load: enough to steady it, not to swamp a big run's server
	raw, err := RawAsyncPublish(ctx, f.NATSURL, n, size, 2*time.Minute)
	if err != nil {
		return res, err
	}
	syncD, syncRate, err := RawSyncPublish(ctx, f.NATSURL, 3000, size, time.Minute)
	if err != nil {
		return res, err
	}
	bound := raw / perJob
	res.Rows = append(res.Rows,
		Row{Figure: fmt.Sprintf("Throughput: job lifecycles/s, %d jobs of 0 s, all services, sim at zero latency", o.Jobs),
			Value:     num(jobsPerSec) + " jobs/s",
			Reference: fmt.Sprintf("JetStream async publish %s msg/s ÷ %.1f facts/job = %s jobs/s", num(raw), perJob, num(bound)),
			Ratio:     ratio(jobsPerSec, bound), Target: target("≥ 2,000 jobs/s", jobsPerSec >= 2000)},
		flatness(run, o.Jobs),
		steadyState(run),
		Row{Figure: "CPU per lifecycle (the whole process: Berth's services, NATS and the simulator, user + system)",
			Value:     fmt.Sprintf("%.2f ms", float64(cpu.Microseconds())/1000/float64(o.Jobs)),
			Reference: fmt.Sprintf("%s of CPU over %s elapsed: %.2f cores busy", ms(cpu), ms(elapsed), cpu.Seconds()/max(elapsed.Seconds(), 1e-9)),
			Target:    target("≤ 0.5 ms CPU per lifecycle", float64(cpu.Microseconds())/1000/float64(o.Jobs) <= 0.5)},
		cpuByPart(shares, o.Jobs),
		Row{Figure: "Events one job costs (facts in the log per job)", Value: fmt.Sprintf("%.2f facts, %d B each on average", perJob, size),
			Reference: "10 facts in a clean lifecycle", Ratio: ratio(perJob, 10)},
		Row{Figure: "Log appends/s during the throughput run (all writers)", Value: num(rate(facts, elapsed)) + " facts/s",
			Reference: fmt.Sprintf("one client's sync publishes %s msg/s (RTT %s)", num(syncRate), pq(syncD)),
			Ratio:     ratio(rate(facts, elapsed), syncRate)},
	)
	types := make([]string, 0, len(run.tl.Types))
	for t := range run.tl.Types {
		types = append(types, t)
	}
	sort.Strings(types)
	var mix []string
	for _, t := range types {
		mix = append(mix, fmt.Sprintf("%s %.2f", strings.TrimSuffix(strings.TrimPrefix(t, "berth."), ".v1"), float64(run.tl.Types[t])/float64(o.Jobs)))
	}
	life := []time.Duration{}
	for _, j := range run.tl.Jobs {
		if !j.Released.IsZero() && !j.Queued.IsZero() {
			life = append(life, j.Released.Sub(j.Queued))
		}
	}
	res.Notes = append(res.Notes,
		fmt.Sprintf("facts per job by type: %s", strings.Join(mix, ", ")),
		fmt.Sprintf("elapsed from the first enqueue to the last slot released: %s; per job, webhook accepted → slot released %s; job completed → slot released %s; runner failures %d",
			ms(elapsed), pq(Summarize(life)), pq(Summarize(run.tl.ReleaseLatency())), f.RunnerFailures()),
		"the raw references publish to a scratch stream on the same server with no Nats-Msg-Id and no expected-sequence check; Berth's appends carry both and wait for each ack",
		fmt.Sprintf("the simulator remembers the newest %d to %d webhooks it sent, not every one of the run (ghsim.Config.KeepDeliveries)", 3*throughputBacklog, 6*throughputBacklog),
	)
	if f.Sim != nil {
		res.Notes = append(res.Notes, fmt.Sprintf("the simulator's server accepted %d connections, %.2f a job (each job's runner dials once, as a runner process does; the dispatcher's API calls reuse theirs)",
			f.Sim.Accepted(), float64(f.Sim.Accepted())/float64(o.Jobs)))
	}
	res.Notes = append(res.Notes, "measured with the CPU profiler on (it parts the CPU by owner); "+e.senders()+"; "+e.jitHandOver())
	res.Notes = append(res.Notes, byTenth...)
	return res, nil
}

// readTenths parts the run's CPU by owner from its tenths' profiles and
// describes each tenth; with path set it writes the whole run's profile
// there, the first and last tenths' beside it (path.first, path.last:
// `go tool pprof -diff_base path.first path.last` shows what grew), and
// the heap profile at the run's end (path.heap).
func readTenths(parts []tenth, path string) (CPUShares, []string, error) {
	whole, err := mergeProfiles(parts)
	if err != nil {
		return nil, nil, err
	}
	if path != "" && len(parts) > 0 {
		last := parts[len(parts)-1]
		for name, raw := range map[string][]byte{path: whole, path + ".first": parts[0].Profile, path + ".last": last.Profile, path + ".heap": last.Heap} {
			if err := os.WriteFile(name, raw, 0o644); err != nil {
				return nil, nil, err
			}
		}
	}
	shares, err := SharesOf(whole)
	if err != nil {
		return nil, nil, err
	}
	var lines []string
	prev := int64(0)
	for i, t := range parts {
		line, err := tenthLine(i, t, prev)
		if err != nil {
			return nil, nil, err
		}
		lines, prev = append(lines, line), t.Released
	}
	return shares, lines, nil
}

// cpuByPart is the CPU per lifecycle of each part of the process, from
// the profile's samples, and Berth's share judged against the target: its
// own samples plus the runtime's (GC, scheduler) in proportion.
func cpuByPart(s CPUShares, jobs int) Row {
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(max(jobs, 1)) }
	owned := s[PartBerth] + s[PartNATS] + s[PartSim]
	berth := s[PartBerth]
	if owned > 0 {
		berth += time.Duration(float64(s[PartOther]) * float64(s[PartBerth]) / float64(owned))
	}
	return Row{Figure: "CPU per lifecycle, Berth's own share (CPU profile samples: Berth's services and its NATS client, with the runtime's GC and scheduling in proportion)",
		Value: fmt.Sprintf("%.2f ms", per(berth)),
		Reference: fmt.Sprintf("by owner: Berth %.2f ms, NATS server %.2f ms, simulator (GitHub, VMs, runners) %.2f ms, runtime %.2f ms",
			per(s[PartBerth]), per(s[PartNATS]), per(s[PartSim]), per(s[PartOther])),
		Target: target("≤ 0.5 ms CPU per lifecycle", per(berth) <= 0.5)}
}

// cpuProfile starts a CPU profile into path, or nothing when path is "";
// stop ends it.
func cpuProfile(path string) (stop func(), err error) {
	return recordInto(path, pprof.StartCPUProfile, pprof.StopCPUProfile)
}

// execTrace starts the runtime's execution tracer into path ("" starts
// nothing) and returns its stop: a trace shows what a goroutine waited on,
// which a CPU profile cannot (`go tool trace`).
func execTrace(path string) (stop func(), err error) {
	return recordInto(path, trace.Start, trace.Stop)
}

// recordInto creates path and starts a recorder writing to it; the stop it
// returns (once, however often called) ends the recorder and closes the
// file. An empty path records nothing.
func recordInto(path string, start func(io.Writer) error, end func()) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := start(f); err != nil {
		f.Close()
		return nil, err
	}
	return sync.OnceFunc(func() { end(); f.Close() }), nil
}

// throughputBacklog caps the unfinished jobs of a throughput run longer
// than it.
const throughputBacklog = 2000

// flatness compares the lifecycle rate of the last tenth of a run with the
// first tenth's (issue 9: within 10% over 100,000 jobs).
func flatness(run runOut, jobs int) Row {
	var ends []time.Time
	for _, j := range run.tl.Jobs {
		if !j.Released.IsZero() {
			ends = append(ends, j.Released)
		}
	}
	row := Row{Figure: "Throughput: the last tenth of the run against the first (lifecycles/s)"}
	tenth := len(ends) / 10
	if tenth < 2 {
		row.Value = "too few jobs"
		return row
	}
	sort.Slice(ends, func(i, k int) bool { return ends[i].Before(ends[k]) })
	first := rate(float64(tenth), ends[tenth-1].Sub(run.start))
	last := rate(float64(tenth), ends[len(ends)-1].Sub(ends[len(ends)-1-tenth]))
	row.Value, row.Reference, row.Ratio = num(last)+" jobs/s", "first tenth: "+num(first)+" jobs/s", ratio(last, first)
	const goal = "flat: the last tenth within 10% of the first over 100,000 jobs"
	if jobs >= 100_000 {
		row.Target = target(goal, last >= 0.9*first)
	} else {
		row.Target = goal + ": not measured at that size here (BENCH_FLAGS='-phases throughput -throughput-jobs 100000'); up to 2,000 jobs all are enqueued at once, so the first tenth includes the start"
	}
	return row
}

// steadyState is the lifecycle rate once the start is over: the first
// tenth of the completions is the ramp (the fleet filling, every service's
// first rounds), and the rest is compared tenth against tenth, the first
// after the ramp with the last (issue 19: like for like).
func steadyState(run runOut) Row {
	var ends []time.Time
	for _, j := range run.tl.Jobs {
		if !j.Released.IsZero() {
			ends = append(ends, j.Released)
		}
	}
	row := Row{Figure: "Throughput in steady state: lifecycles/s after the ramp (the first tenth of completions), its first tenth against its last"}
	tenth := len(ends) / 10
	if tenth < 2 {
		row.Value = "too few jobs"
		return row
	}
	sort.Slice(ends, func(i, k int) bool { return ends[i].Before(ends[k]) })
	ramp := ends[tenth-1]
	steady := rate(float64(len(ends)-tenth), ends[len(ends)-1].Sub(ramp))
	win := (len(ends) - tenth) / 10
	if win < 1 {
		row.Value = num(steady) + " jobs/s"
		return row
	}
	first := rate(float64(win), ends[tenth-1+win].Sub(ramp))
	last := rate(float64(win), ends[len(ends)-1].Sub(ends[len(ends)-1-win]))
	row.Value = fmt.Sprintf("%s jobs/s (first tenth %s, last tenth %s)", num(steady), num(first), num(last))
	row.Reference, row.Ratio = "the last tenth against the first", ratio(last, first)
	return row
}

// processCPU is the CPU time (user and system) this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// diagnose describes the jobs the simulator has not completed as the
// simulator and the dispatcher's fold see them, for a stalled phase.
func diagnose(ctx context.Context, f *Fleet) string {
	var b strings.Builder
	sim, err := f.simJobs(ctx)
	if err != nil {
		return "the simulator's jobs are unknown: " + err.Error()
	}
	open := map[int64]ghsim.JobView{}
	for _, j := range sim.Jobs {
		if j.Status != ghsim.StatusCompleted {
			open[j.ID] = j
		}
	}
	fmt.Fprintf(&b, "%d jobs not completed in the simulator", len(open))
	shown := 0
	_ = f.Snapshot(ctx, func(fl *events.Fleet) {
		for id, j := range open {
			if shown == 10 {
				break
			}
			shown++
			fmt.Fprintf(&b, "\n  job %d labels %v: sim %s runner %q", id, j.Labels, j.Status, j.RunnerName)
			if fj := fl.Jobs[id]; fj != nil {
				fmt.Fprintf(&b, "; fold status %s labels %v runner %q minted %d failed %d", fj.Status, fj.Labels, fj.Runner, fj.Minted, fj.FailedAttempts)
			} else {
				b.WriteString("; not in the dispatcher's fold")
			}
			names := []string{j.RunnerName}
			for n := 1; n <= 3; n++ {
				names = append(names, events.AttemptID(id, n))
			}
			for i, name := range names {
				if a := fl.Attempts[name]; a != nil && (i == 0 || name != j.RunnerName) {
					fmt.Fprintf(&b, "\n    attempt %s (booked for job %d) on %s pool %s: %s, release %q, bound to job %d", a.ID, a.JobID, a.Host, a.Pool, a.Stage(), a.ReleaseReason, fl.BoundJob(a.ID))
				}
			}
		}
		st := fl.Status()
		for _, p := range st.Pools {
			fmt.Fprintf(&b, "\n  pool %s: held %d of %d, pending demand %d, waiting for slot %d", p.Name, p.Held, p.Capacity, p.PendingDemand, p.WaitingForSlot)
		}
	})
	runners := sim.Runners
	for i, r := range runners {
		if i == 20 {
			fmt.Fprintf(&b, "\n  … and %d more sim runners", len(runners)-i)
			break
		}
		fmt.Fprintf(&b, "\n  sim runner %s %v: %s busy %v job %d", r.Name, r.Labels, r.Status, r.Busy, r.JobID)
	}
	return b.String()
}
