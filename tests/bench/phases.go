package bench

import (
	"bytes"
	"context"
	"fmt"
	"github.com/nats-io/nats.go/jetstream"
	"log/slog"
	"math"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/natsembed"
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
}

// Unloaded is dispatch latency with the fleet nearly idle.
type Unloaded struct {
	Rate int
	Dist Dist
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
	f, err := e.fleet(ctx, FleetOptions{Hosts: o.Hosts, LinuxSlots: 64, MacSlots: 32})
	if err != nil {
		return res, err
	}
	defer f.Close()
	specs := Workload(o.Jobs, e.Seed, 0.3, 0, 0, e.BareLabel)
	e.say("throughput: %d jobs of zero duration on %d hosts (64 linux + 32 macos slots each)", o.Jobs, o.Hosts)
	// Always profiled: the profile's samples say whose the CPU was.
	var prof bytes.Buffer
	stopProfile, profiling := profileCPU(&prof)
	fd := feed{}
	if o.Jobs > throughputBacklog {
		// A long run grows the history, not the queue: at most this many
		// jobs wait or run at once, so flatness measures the cost of what
		// the folds keep.
		fd.limit = throughputBacklog
	}
	cpuBefore := processCPU()
	run, err := e.drive(ctx, "throughput", f, specs, fd, settled(o.Jobs))
	cpu := processCPU() - cpuBefore
	stopProfile()
	if err != nil {
		return res, err
	}
	var shares CPUShares
	if profiling {
		if o.CPUProfile != "" {
			if err := os.WriteFile(o.CPUProfile, prof.Bytes(), 0o644); err != nil {
				return res, err
			}
		}
		if shares, err = SharesOf(prof.Bytes()); err != nil {
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
	)
	res.Notes = append(res.Notes, "measured with the CPU profiler on (it parts the CPU by owner); "+e.senders()+"; "+e.jitHandOver())
	return res, nil
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
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
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

// LatencyOptions size the dispatch-latency phase.
type LatencyOptions struct {
	Rates   []int
	Window  time.Duration // how long each rate is offered
	MaxJobs int           // cap on jobs per rate
	Hosts   int
}

// DispatchLatency offers zero-duration jobs at each rate to a fresh fleet
// and measures webhook accepted (JobQueued stored) → placement stored
// (AttemptPlaced stored), beside one JetStream publish round trip on the
// same server.
func DispatchLatency(ctx context.Context, e Env, o LatencyOptions) (Result, error) {
	res := Result{Phase: "dispatch latency"}
	for _, r := range o.Rates {
		jobs := min(int(float64(r)*o.Window.Seconds()), o.MaxJobs)
		if jobs < 1 {
			continue
		}
		e.say("dispatch latency: %d jobs offered at %d jobs/s on %d hosts", jobs, r, o.Hosts)
		rows, notes, d, err := e.latencyAt(ctx, r, jobs, o.Hosts)
		if err != nil {
			return res, err
		}
		if u := e.Unloaded; u != nil && (u.Rate == 0 || r < u.Rate) {
			u.Rate, u.Dist = r, d
		}
		res.Rows = append(res.Rows, rows...)
		res.Notes = append(res.Notes, notes...)
	}
	res.Notes = append(res.Notes, e.senders()+"; the delivery lag above is the queue in front of the dispatcher's intake")
	return res, nil
}

func (e Env) latencyAt(ctx context.Context, r, jobs, hosts int) ([]Row, []string, Dist, error) {
	f, err := e.fleet(ctx, FleetOptions{Hosts: hosts, LinuxSlots: 150, MacSlots: 60})
	if err != nil {
		return nil, nil, Dist{}, err
	}
	defer f.Close()
	specs := Workload(jobs, e.Seed+uint64(r), 0.3, 0, 0, e.BareLabel)
	base, err := LastSeq(ctx, f.JS)
	if err != nil {
		return nil, nil, Dist{}, err
	}
	probe, err := StartProbe(ctx, f.JS, base+1)
	if err != nil {
		return nil, nil, Dist{}, err
	}
	run, err := e.drive(ctx, fmt.Sprintf("dispatch latency at %d jobs/s", r), f, specs, feed{rate: float64(r)}, settled(jobs))
	received := probe.Stop()
	if err != nil {
		return nil, nil, Dist{}, err
	}
	d := Summarize(run.tl.PlaceLatency())
	rtt, _, err := RawSyncPublish(ctx, f.NATSURL, 2000, 600, time.Minute)
	if err != nil {
		return nil, nil, Dist{}, err
	}
	var first, last time.Time
	var lag []time.Duration
	for _, j := range f.Sim.Jobs() {
		t := run.tl.Jobs[j.ID]
		if t == nil || t.Queued.IsZero() {
			continue
		}
		lag = append(lag, t.Queued.Sub(j.QueuedAt))
		if first.IsZero() || t.Queued.Before(first) {
			first = t.Queued
		}
		if t.Queued.After(last) {
			last = t.Queued
		}
	}
	offered := rate(float64(jobs-1), run.enqueued.Sub(run.start))
	accepted := rate(float64(len(lag)-1), last.Sub(first))
	row := Row{Figure: fmt.Sprintf("Dispatch latency @ %d jobs/s offered (webhook accepted → placement stored), %d jobs", r, jobs),
		Value:     pq(d),
		Reference: "one sync publish RTT " + pq(rtt),
		Ratio:     fmt.Sprintf("p50 %s, p99 %s", ratio(float64(d.P50), float64(rtt.P50)), ratio(float64(d.P99), float64(rtt.P99))),
		Target:    "none at this rate"}
	if r == 200 {
		row.Target = target("p50 ≤ 0.5 ms, p99 ≤ 2 ms", d.P50 <= 500*time.Microsecond && d.P99 <= 2*time.Millisecond)
	}
	toReserve, toPlace := run.tl.PlaceParts()
	delivery, berth, early := run.tl.DeliveryParts(received)
	notes := []string{fmt.Sprintf("at %d jobs/s: offered %s jobs/s, webhooks accepted at %s jobs/s; delivery lag (sim enqueue → accepted) %s; placements %d of %d jobs; of the latency, accepted → slot reserved %s, reserved → placement stored (JIT-config call, seal, append) %s",
		r, num(offered), num(accepted), pq(Summarize(lag)), d.N, jobs, pq(Summarize(toReserve)), pq(Summarize(toPlace)))}
	if r != 200 {
		return []Row{row}, notes, d, nil
	}
	share := Summarize(berth)
	own := Row{Figure: fmt.Sprintf("Dispatch latency @ %d jobs/s, Berth's own share: the log handed the queued fact to its consumers → slot reserved stored (fold, Decide, the reservation's append; no GitHub call)", r),
		Value:     pq(share),
		Reference: "before it, queued stored → handed to a consumer (NATS's delivery): " + pq(Summarize(delivery)),
		Ratio:     fmt.Sprintf("p50 %s, p99 %s of accepted → reserved", ratio(float64(share.P50), float64(Summarize(toReserve).P50)), ratio(float64(share.P99), float64(Summarize(toReserve).P99))),
		Target:    target("p50 ≤ 0.3 ms, p99 ≤ 2 ms", share.P50 <= 300*time.Microsecond && share.P99 <= 2*time.Millisecond)}
	notes = append(notes, fmt.Sprintf("at %d jobs/s: Berth's own share is measured from when a probe consumer on the same server received each job's queued fact (the server signals the dispatcher's consumer in the same pass); for %d of %d jobs the reservation was stored before the probe's receipt and counts as 0",
		r, early, share.N))
	return []Row{row, own}, notes, d, nil
}

// ReleaseOptions size the release-latency phase.
type ReleaseOptions struct {
	Jobs, Hosts int
	Rate        float64
}

// ReleaseLatency runs the same workload twice on fresh fleets, once with
// teardowns that return and once with every backend stop wedged forever,
// and measures job completed → slot released (both stored).
func ReleaseLatency(ctx context.Context, e Env, o ReleaseOptions) (Result, error) {
	res := Result{Phase: "release latency"}
	var dists [2]Dist
	var notes []string
	for i, wedge := range []bool{false, true} {
		e.say("release latency: %d jobs at %.0f jobs/s on %d hosts, stops wedged: %v", o.Jobs, o.Rate, o.Hosts, wedge)
		f, err := e.fleet(ctx, FleetOptions{Hosts: o.Hosts, LinuxSlots: 32, MacSlots: 16, PhysicalCap: o.Jobs + 64,
			WedgeStops: wedge, StopTimeout: time.Second, AbandonedCap: o.Jobs + 1})
		if err != nil {
			return res, err
		}
		specs := Workload(o.Jobs, e.Seed+99, 0.3, 0, 10*time.Millisecond, e.BareLabel)
		done := func(c *Counter) bool {
			return c.Get(events.TypeJobCompleted) >= int64(o.Jobs) && c.Get(events.TypeSlotReleased) >= c.Get(events.TypeSlotReserved)
		}
		run, err := e.drive(ctx, fmt.Sprintf("release latency (wedged %v)", wedge), f, specs, feed{rate: o.Rate}, done)
		f.Close()
		if err != nil {
			return res, err
		}
		dists[i] = Summarize(run.tl.ReleaseLatency())
		if wedge {
			notes = append(notes, fmt.Sprintf("wedged run: %d jobs completed, %d slots released, %d VMs abandoned, %d stopped (every stop hung; stop deadline 1 s, abandoned-VM cordon cap raised above the job count so the fleet keeps placing)",
				dists[i].N, run.tl.Types[events.TypeSlotReleased], run.tl.Types[events.TypeAttemptAbandoned], run.tl.Types[events.TypeAttemptStopped]))
		}
	}
	w, n := dists[1], dists[0]
	res.Rows = append(res.Rows, Row{
		Figure:    fmt.Sprintf("Release latency, every teardown wedged forever (job completed → slot released), %d jobs at %.0f/s", o.Jobs, o.Rate),
		Value:     pq(w),
		Reference: "same workload, teardowns return: " + pq(n),
		Ratio:     fmt.Sprintf("p50 %s, p99 %s", ratio(float64(w.P50), float64(n.P50)), ratio(float64(w.P99), float64(n.P99))),
		Target:    target("p99 ≤ 50 ms (law 2: release never waits on teardown)", w.P99 <= 50*time.Millisecond),
	})
	res.Notes = notes
	return res, nil
}

// MemoryOptions size the memory phase.
type MemoryOptions struct {
	Warmup, Jobs   int
	HeapProfileDir string // write heap profiles before and after here when not ""
}

type memPoint struct {
	heap, objects uint64
	goroutines    int
}

func measure() memPoint {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return memPoint{heap: m.HeapAlloc, objects: m.HeapObjects, goroutines: runtime.NumGoroutine()}
}

// quiet waits until the goroutine count holds still for a second (at most
// 15 s): runners, HTTP connections and steps of the last jobs wind down;
// then past the NATS file store's block-cache expiry (10 s without
// activity), so the server's transient read cache is not counted as
// retained.
func quiet() {
	defer time.Sleep(11 * time.Second)
	last, since := runtime.NumGoroutine(), time.Now()
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); {
		time.Sleep(100 * time.Millisecond)
		if n := runtime.NumGoroutine(); n != last {
			last, since = n, time.Now()
		} else if time.Since(since) >= time.Second {
			return
		}
	}
}

func heapProfile(dir, name string) error {
	if dir == "" {
		return nil
	}
	f, err := os.Create(dir + "/" + name)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		return err
	}
	// The goroutines beside it, grouped by stack: what a change in their
	// count is made of.
	g, err := os.Create(dir + "/" + strings.TrimSuffix(name, ".pb.gz") + "-goroutines.txt")
	if err != nil {
		return err
	}
	defer g.Close()
	return pprof.Lookup("goroutine").WriteTo(g, 1)
}

// Memory runs a warm-up, measures the heap after a forced GC (twice), runs
// N more jobs of varied content through the dispatcher, the watchdog and one
// agent with the simulator and NATS alive, measures again once quiet, and
// reports retained bytes, objects and goroutines per job.
func Memory(ctx context.Context, e Env, o MemoryOptions) (Result, error) {
	res := Result{Phase: "memory"}
	f, err := e.fleet(ctx, FleetOptions{Hosts: 1, LinuxSlots: 16, MacSlots: 8})
	if err != nil {
		return res, err
	}
	defer f.Close()
	specs := Workload(o.Warmup+o.Jobs, e.Seed+7, 0.3, 0, 20*time.Millisecond, e.BareLabel)
	fd := feed{limit: 24}
	e.say("memory: warm-up of %d jobs, then %d jobs, one agent, at most 24 unfinished", o.Warmup, o.Jobs)
	if _, err := e.drive(ctx, "memory warm-up", f, specs[:o.Warmup], fd, settled(o.Warmup)); err != nil {
		return res, err
	}
	quiet()
	if err := f.Settle(ctx); err != nil {
		return res, err
	}
	before := measure()
	if err := heapProfile(o.HeapProfileDir, "heap-before.pb.gz"); err != nil {
		return res, err
	}
	heapBefore, err := exactHeap()
	if err != nil {
		return res, err
	}
	if _, err := e.drive(ctx, "memory", f, specs[o.Warmup:], fd, settled(o.Jobs)); err != nil {
		return res, err
	}
	quiet()
	if err := f.Settle(ctx); err != nil {
		return res, err
	}
	after := measure()
	if err := heapProfile(o.HeapProfileDir, "heap-after.pb.gz"); err != nil {
		return res, err
	}
	heapAfter, err := exactHeap()
	if err != nil {
		return res, err
	}
	// The simulator keeps every job and every webhook it sent: close it
	// and measure again to see its share.
	simBytes := 0
	for _, d := range f.Sim.Deliveries() {
		simBytes += len(d.Body)
	}
	f.Sim.Close()
	f.Sim = nil
	noSim := measure()
	var foldJobs, foldAttempts, settledJobs, settledAttempts int
	if err := f.Snapshot(ctx, func(fl *events.Fleet) {
		foldJobs, foldAttempts = len(fl.Jobs), len(fl.Attempts)
		settledJobs, settledAttempts = fl.SettledCounts()
	}); err != nil {
		return res, err
	}
	n := float64(o.Jobs)
	perJob := (float64(after.heap) - float64(before.heap)) / n
	objs := (float64(after.objects) - float64(before.objects)) / n
	all := float64(o.Warmup + o.Jobs)
	simJob := (float64(after.heap) - float64(noSim.heap)) / all
	simObjs := (float64(after.objects) - float64(noSim.objects)) / all
	res.Rows = append(res.Rows,
		Row{Figure: fmt.Sprintf("Memory: retained heap per job over %d jobs, whole process (after a forced GC, twice)", o.Jobs),
			Value:     fmt.Sprintf("%s and %.1f objects per job", bytesStr(perJob), objs),
			Reference: fmt.Sprintf("heap after a %d-job warm-up: %s, %s objects", o.Warmup, bytesStr(float64(before.heap)), commas(int64(before.objects))),
			Ratio:     "heap ×" + fmt.Sprintf("%.2f", float64(after.heap)/float64(before.heap)),
			Target:    "flat in job count (law 5); GitLab's manager kept ~4.5 KB and 17 objects per job"},
		Row{Figure: "Memory: the same without the simulator's share (Berth's three folds and the NATS server)",
			Value:     fmt.Sprintf("%s and %.1f objects per job", bytesStr(perJob-simJob), objs-simObjs),
			Reference: fmt.Sprintf("the simulator keeps %s and %.1f objects per job (heap drop when it is closed ÷ all jobs)", bytesStr(simJob), simObjs),
			Target:    target("≤ 64 B and ≤ 0.1 heap objects per job", perJob-simJob <= 64 && objs-simObjs <= 0.1)},
		Row{Figure: "Memory: goroutines before → after the jobs", Value: fmt.Sprintf("%d → %d", before.goroutines, after.goroutines),
			Reference: "", Ratio: fmt.Sprintf("%+.3f per job", float64(after.goroutines-before.goroutines)/n),
			Target: target("goroutines back to baseline (law 5)", after.goroutines <= before.goroutines)},
	)
	res.Notes = append(res.Notes,
		fmt.Sprintf("the heap is the whole process: besides the dispatcher, the watchdog and the agent it holds the simulator (it keeps every job and every webhook body: %s per job of bodies alone) and the embedded NATS server (message-id window of 2 min, per-subject index); measured 11 s after the last fact, past the file store's block-cache expiry",
			bytesStr(float64(simBytes)/all)),
		fmt.Sprintf("the dispatcher's fold holds %d job and %d attempt records, and the ids of %d jobs and %d attempts that settled (each fold compacted as its housekeeping will %s after the end, at the 72 h retention, before each measure: a job that is over leaves only its ids)",
			foldJobs, foldAttempts, settledJobs, settledAttempts, events.DefaultSettleAfter),
	)
	if o.HeapProfileDir != "" {
		res.Notes = append(res.Notes, "heap profiles: `go tool pprof -top -diff_base "+o.HeapProfileDir+"/heap-before.pb.gz "+o.HeapProfileDir+"/heap-after.pb.gz`")
	}
	if heapBefore != nil {
		res.Rows = append(res.Rows, heapByOwner(heapBefore, heapAfter, n))
	}
	return res, nil
}

// exactHeap is the heap by owner when every allocation is sampled
// (-heap-owners), else nil.
func exactHeap() (HeapShares, error) {
	if runtime.MemProfileRate != 1 {
		return nil, nil
	}
	var buf bytes.Buffer
	if err := pprof.Lookup("heap").WriteTo(&buf, 0); err != nil {
		return nil, err
	}
	return HeapSharesOf(buf.Bytes())
}

// heapByOwner is the heap retained per job by each part, from exact heap
// profiles taken beside the before and after measures.
func heapByOwner(before, after HeapShares, jobs float64) Row {
	per := func(p Part) string {
		d := after[p]
		b := before[p]
		return fmt.Sprintf("%s, %.1f objects", bytesStr(float64(d[0]-b[0])/jobs), float64(d[1]-b[1])/jobs)
	}
	berth := float64(after[PartBerth][0]-before[PartBerth][0]) / jobs
	objs := float64(after[PartBerth][1]-before[PartBerth][1]) / jobs
	return Row{Figure: "Memory: retained per job by owner, every allocation sampled (-heap-owners): Berth's folds and services",
		Value:     fmt.Sprintf("%s and %.1f objects per job", bytesStr(berth), objs),
		Reference: fmt.Sprintf("NATS server %s; simulator %s; runtime %s", per(PartNATS), per(PartSim), per(PartOther)),
		Target:    target("≤ 64 B and ≤ 0.1 heap objects per job", berth <= 64 && objs <= 0.1)}
}

// ReplayOptions size the replay phase.
type ReplayOptions struct {
	Jobs int
}

// Replay writes many lifecycles to a fresh server and measures
// eventlog.Replay (decode and fold) against a raw ordered consumer reading
// the same stream, best of two rounds each.
func Replay(ctx context.Context, e Env, o ReplayOptions) (Result, error) {
	res := Result{Phase: "replay"}
	dir, err := os.MkdirTemp("", "berth-bench-replay-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	srv, err := natsembed.StartEmbedded(natsembed.EmbeddedConfig{Listen: "127.0.0.1:0", StoreDir: dir})
	if err != nil {
		return res, err
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	nc, js, err := eventlog.Connect(srv.ClientURL(), "berth-bench-replay")
	if err != nil {
		return res, err
	}
	defer nc.Close()
	if _, err := eventlog.EnsureStream(ctx, js, eventlog.StreamConfig{}); err != nil {
		return res, err
	}
	e.say("replay: writing %d job lifecycles", o.Jobs)
	total, err := Synthesize(ctx, srv.ClientURL(), 10, o.Jobs, e.Timeout)
	if err != nil {
		return res, err
	}
	var bestRaw, bestReplay float64
	var bytes uint64
	var last *events.Fleet
	for round := 0; round < 2; round++ {
		raw, b, err := RawRead(ctx, js, e.Timeout)
		if err != nil {
			return res, err
		}
		bytes = b
		bestRaw = math.Max(bestRaw, raw)
		rctx, cancel := context.WithTimeout(ctx, e.Timeout)
		start := time.Now()
		fl, err := eventlog.Replay(rctx, js, nil)
		took := time.Since(start)
		cancel()
		if err != nil {
			return res, fmt.Errorf("replay: %w", err)
		}
		if fl.Applied != total || len(fl.Jobs) != o.Jobs {
			return res, fmt.Errorf("replay folded %d facts and %d jobs, want %d and %d", fl.Applied, len(fl.Jobs), total, o.Jobs)
		}
		bestReplay = math.Max(bestReplay, rate(float64(total), took))
		e.say("replay: round %d: raw %s msg/s, replay %s events/s", round+1, num(raw), num(rate(float64(total), took)))
		last = fl
	}
	restart, snapBytes, err := restartFromSnapshot(ctx, js, last, e.Timeout)
	if err != nil {
		return res, err
	}
	e.say("replay: restart from a snapshot of %s took %s", bytesStr(float64(snapBytes)), ms(restart))
	// The same fold as a service keeps it once the jobs settled: its
	// housekeeping compacts it every minute, and a job that has been over
	// for events.DefaultSettleAfter leaves only its ids (issue 19).
	last.Compact(time.Now().Add(events.DefaultSettleAfter+time.Minute), 72*time.Hour)
	restartSettled, settledBytes, err := restartFromSnapshot(ctx, js, last, e.Timeout)
	if err != nil {
		return res, err
	}
	e.say("replay: restart from a settled snapshot of %s took %s", bytesStr(float64(settledBytes)), ms(restartSettled))
	res.Rows = append(res.Rows, Row{
		Figure:    fmt.Sprintf("Replay: events/s rebuilding the projection (eventlog.Replay), %s events", commas(int64(total))),
		Value:     num(bestReplay) + " events/s",
		Reference: "raw ordered consumer, same stream: " + num(bestRaw) + " msg/s",
		Ratio:     ratio(bestReplay, bestRaw), Target: target("≥ 0.5× the raw ordered-consumer rate", bestReplay >= bestRaw/2),
	}, Row{
		Figure:    fmt.Sprintf("Restart with a snapshot: start → first Decide, %s events behind it, snapshot covering them all", commas(int64(total))),
		Value:     ms(restart),
		Reference: fmt.Sprintf("full rebuild of the same log: %s", ms(time.Duration(float64(total)/bestReplay*float64(time.Second)))),
		Ratio:     ratio(float64(restart), float64(total)/bestReplay*float64(time.Second)),
		Target:    restartTarget(total, restart),
	}, Row{
		Figure:    fmt.Sprintf("Restart with a snapshot of the settled fold (every job over for %s: ids only), %s events behind it", events.DefaultSettleAfter, commas(int64(total))),
		Value:     ms(restartSettled),
		Reference: fmt.Sprintf("snapshot %s, against %s with every record", bytesStr(float64(settledBytes)), bytesStr(float64(snapBytes))),
		Ratio:     ratio(float64(restartSettled), float64(restart)),
		Target:    restartTarget(total, restartSettled),
	})
	res.Notes = append(res.Notes, fmt.Sprintf("%s events (%s) from %d synthetic lifecycles of ten facts, written with the services' ids and headers; best of two rounds each; a full rebuild takes %s",
		commas(int64(total)), bytesStr(float64(bytes)), o.Jobs, ms(time.Duration(float64(total)/bestReplay*float64(time.Second)))))
	return res, nil
}

// diagnose describes the jobs the simulator has not completed as the
// simulator and the dispatcher's fold see them, for a stalled phase.
func diagnose(ctx context.Context, f *Fleet) string {
	var b strings.Builder
	open := map[int64]ghsim.JobView{}
	for _, j := range f.Sim.Jobs() {
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
	runners := f.Sim.Runners()
	for i, r := range runners {
		if i == 20 {
			fmt.Fprintf(&b, "\n  … and %d more sim runners", len(runners)-i)
			break
		}
		fmt.Fprintf(&b, "\n  sim runner %s %v: %s busy %v job %d", r.Name, r.Labels, r.Status, r.Busy, r.JobID)
	}
	return b.String()
}

// snapReactor is a service's shell with no decisions: it folds, saves
// and restores as the services do, and closes decided at its first Decide
// (which the loop makes only once caught up).
type snapReactor struct {
	*eventlog.Shell
	decided chan struct{}
	once    bool
}

func (r *snapReactor) Decide(context.Context) {
	if !r.once {
		r.once = true
		close(r.decided)
	}
}

// restartFromSnapshot stores fl as a service's snapshot, then times a loop
// from its start to its first Decide: restore, check the log still joins
// it, fold the (empty) tail, catch up.
func restartFromSnapshot(ctx context.Context, js jetstream.JetStream, fl *events.Fleet, timeout time.Duration) (time.Duration, int, error) {
	b, err := events.MarshalSnapshot(fl)
	if err != nil {
		return 0, 0, err
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: events.BucketSnapshots, History: 1})
	if err != nil {
		return 0, 0, err
	}
	if err := eventlog.PutSnapshot(ctx, js, kv, "bench", fl.LastSeq, b); err != nil {
		return 0, 0, err
	}
	l := &eventlog.Loop{JS: js, Filters: []string{events.SubjectAll}, SnapshotKey: "bench", SnapshotEvery: time.Hour}
	r := &snapReactor{Shell: eventlog.NewShell(l, nil, nil, slog.New(slog.DiscardHandler)), decided: make(chan struct{})}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- l.Run(rctx, r) }()
	select {
	case <-r.decided:
	case err := <-done:
		return 0, 0, fmt.Errorf("restart: the loop ended before deciding: %v", err)
	case <-rctx.Done():
		return 0, 0, fmt.Errorf("restart: no Decide within %s", timeout)
	}
	took := time.Since(start)
	cancel()
	<-done
	gotSettled, _ := r.Fold.SettledCounts()
	wantSettled, _ := fl.SettledCounts()
	if len(r.Fold.Jobs) != len(fl.Jobs) || gotSettled != wantSettled {
		return 0, 0, fmt.Errorf("restart: the restored fold holds %d jobs and %d settled ids, the replay %d and %d", len(r.Fold.Jobs), gotSettled, len(fl.Jobs), wantSettled)
	}
	return took, len(b), nil
}

// restartTarget judges the restart against issue 9's target, which is set
// for a log of 1,000,000 events: a smaller run says how it did, not that
// the target is met.
func restartTarget(events int, took time.Duration) string {
	const goal = "≤ 1 s with 1,000,000 events behind it"
	if events >= 1_000_000 {
		return target(goal, took <= time.Second)
	}
	return fmt.Sprintf("%s: not measured at that size here (make bench BENCH_FLAGS='-phases replay -replay-jobs 100000' does)", goal)
}
