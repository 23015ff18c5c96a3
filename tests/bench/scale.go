package bench

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/tests/ghsim"
)

// ScaleOptions size the scale phase.
type ScaleOptions struct {
	Hosts int
	// Jobs run at once; each runs for Duration, which must cover filling the
	// fleet and probing it.
	Jobs     int
	Duration time.Duration
	// LinuxSlots and MacSlots per host; 0 means 4 and 2.
	LinuxSlots, MacSlots int
	// Probes are zero-duration jobs offered at the unloaded latency rate
	// while the Jobs run; 0 means 100.
	Probes int
	// CPUProfile, when not "", receives a CPU profile of the probe window.
	CPUProfile string
	// Trace, when not "", receives an execution trace of the probe window.
	Trace string
	// HeapProfileDir, when not "", receives heap profiles of the idle
	// fleet and of the full one, each after the forced GCs of its reading.
	HeapProfileDir string
	// Heartbeat is each agent's; 0 means the agents' default (5 s), which
	// a fleet of this size runs with.
	Heartbeat time.Duration
}

// Scale is issue 9's sixth figure. It fills many hosts with Jobs
// concurrent jobs, then, while they all run, offers Probes jobs at the
// latency phase's unloaded rate and compares their dispatch latency with
// the unloaded figure. The heap, after a forced GC, is read before the
// fill, with every job running, and once all have finished: memory should
// follow the live jobs, not the history.
func Scale(ctx context.Context, e Env, o ScaleOptions) (Result, error) {
	res := Result{Phase: "scale"}
	o.LinuxSlots, o.MacSlots, o.Probes = cmp.Or(o.LinuxSlots, 4), cmp.Or(o.MacSlots, 2), cmp.Or(o.Probes, 100)
	o.Heartbeat = cmp.Or(o.Heartbeat, config.DefaultHeartbeat)
	rate := 50
	if u := e.Unloaded; u != nil && u.Rate > 0 {
		rate = u.Rate
	}
	fill := Workload(o.Jobs, e.Seed+3, 0.3, o.Duration, o.Duration, e.BareLabel)
	probes := Workload(o.Probes, e.Seed+4, 0.3, 0, 0, e.BareLabel)
	perPool, err := scalePerPool(o, fill, probes)
	if err != nil {
		return res, err
	}
	f, err := e.fleet(ctx, FleetOptions{Hosts: o.Hosts, LinuxSlots: o.LinuxSlots, MacSlots: o.MacSlots, World: e.World, WorldProcs: e.WorldProcs, Heartbeat: o.Heartbeat})
	if err != nil {
		return res, err
	}
	defer f.Close()
	idle, err := measureFleet(ctx, f)
	if err != nil {
		return res, err
	}
	if err := heapProfile(o.HeapProfileDir, "scale-idle.pb.gz"); err != nil {
		return res, err
	}
	base, err := LastSeq(ctx, f.JS)
	if err != nil {
		return res, err
	}
	c, err := Count(ctx, f.JS, base+1)
	if err != nil {
		return res, err
	}
	defer c.Stop()
	r := &scaleRun{e: e, o: o, f: f, c: c, rate: rate}
	defer e.every(30*time.Second, func() { e.say("scale: %s", r.status()) })()

	e.say("scale: filling %d hosts (%d linux + %d macos slots) with %d jobs of %s", o.Hosts, o.LinuxSlots*o.Hosts, o.MacSlots*o.Hosts, o.Jobs, o.Duration)
	filled, isFill, err := r.fillUp(ctx, fill)
	if err != nil {
		return res, err
	}
	loaded, err := measureFleet(ctx, f)
	if err != nil {
		return res, err
	}
	if err := heapProfile(o.HeapProfileDir, "scale-loaded.pb.gz"); err != nil {
		return res, err
	}
	e.say("scale: %d jobs running after %s; offering %d probe jobs at %d jobs/s", o.Jobs, filled.Round(time.Millisecond), o.Probes, rate)
	probeStart, probesDone, err := r.probe(ctx, probes)
	if err != nil {
		return res, err
	}
	// Its allocations less the loaded fleet's are what the probe window
	// allocated (-sample_index=alloc_space).
	if err := heapProfile(o.HeapProfileDir, "scale-probed.pb.gz"); err != nil {
		return res, err
	}
	if o.CPUProfile != "" {
		res.Notes = append(res.Notes, "CPU profile of the probe window: `go tool pprof -top "+o.CPUProfile+"`")
		if f.world != nil {
			res.Notes = append(res.Notes, "the world process's: `go tool pprof -top "+o.CPUProfile+".world`")
		}
	}
	if d := o.HeapProfileDir; d != "" {
		res.Notes = append(res.Notes, "heap of the running jobs: `go tool pprof -top -diff_base "+d+"/scale-idle.pb.gz "+d+"/scale-loaded.pb.gz`; "+
			"what the probe window allocated: `go tool pprof -top -sample_index=alloc_space -diff_base "+d+"/scale-loaded.pb.gz "+d+"/scale-probed.pb.gz`")
	}
	e.say("scale: probes served; waiting for the %d jobs to finish", o.Jobs)
	last, tl, err := r.drain(ctx, base)
	if err != nil {
		return res, err
	}
	quiet()
	// What is over is kept whole for DefaultSettleAfter, then as ids: the
	// folds are compacted as their housekeeping will be by then, as in
	// the memory phase, so the figure is history, not the settle window.
	if err := f.Settle(ctx); err != nil {
		return res, err
	}
	after, err := measureFleet(ctx, f)
	if err != nil {
		return res, err
	}
	if err := f.closeSim(ctx); err != nil { // it keeps every job and webhook: its share is not Berth's
		return res, err
	}
	noSim, err := measureFleet(ctx, f)
	if err != nil {
		return res, err
	}

	fillTL, probeTL := splitTimeline(tl, isFill)
	if firstEnd := firstCompleted(fillTL); firstEnd.Before(probesDone) {
		return res, fmt.Errorf("scale: a job of the fill finished while probes were still served, so they did not all run under the full load; raise -scale-duration above %s",
			(filled + probesDone.Sub(probeStart)).Round(time.Second))
	}
	res.Rows = append(res.Rows, r.rows(filled, fillTL, probeTL, scaleHeaps{idle: idle, loaded: loaded, after: after, noSim: noSim})...)
	res.Notes = append(res.Notes, slowestProbes(probeTL, probeStart, 5), r.cpuNote())
	n := float64(o.Jobs + o.Probes)
	res.Notes = append(res.Notes, fmt.Sprintf("%d linux and %d macos jobs and probes by label match; %.2f facts per job; runner failures %d",
		perPool["linux"], perPool["macos"], float64(last-base)/n, f.RunnerFailures()))
	return res, nil
}

// scalePerPool counts the jobs and probes each pool gets by label match, and
// refuses a size whose jobs cannot all run at once: the phase measures a
// full fleet, not a queue.
func scalePerPool(o ScaleOptions, fill, probes []ghsim.JobSpec) (map[string]int, error) {
	pools := map[string][]string{"linux": LinuxLabels, "macos": MacLabels}
	perPool := map[string]int{}
	for _, s := range append(fill[:len(fill):len(fill)], probes...) {
		perPool[events.MatchPool(s.Labels, pools)]++
	}
	for pool, slots := range map[string]int{"linux": o.LinuxSlots * o.Hosts, "macos": o.MacSlots * o.Hosts} {
		if perPool[pool] > slots {
			return nil, fmt.Errorf("scale: %d %s jobs and probes need more than the %d %s slots; raise -scale-%s-slots so every job runs at once",
				perPool[pool], pool, slots, pool, map[string]string{"linux": "linux", "macos": "mac"}[pool])
		}
	}
	return perPool, nil
}

// scaleRun is one run of the scale phase: its fleet and the counter of the
// facts logged since it started.
type scaleRun struct {
	e    Env
	o    ScaleOptions
	f    *Fleet
	c    *Counter
	rate int
	// probeCPU is the cores this process and the world process used
	// while the probes were served.
	probeCPU [2]float64
}

// status is the progress line: what runs, and what the log has seen.
func (r *scaleRun) status() string {
	c := r.c
	total, last := c.Total()
	return fmt.Sprintf("%d running, %d completed; log: %d queued, %d reserved, %d placed, %d released, %d facts, the last %s ago; runner failures %d",
		c.Get(events.TypeJobInProgress), c.Get(events.TypeJobCompleted), c.Get(events.TypeJobQueued), c.Get(events.TypeSlotReserved),
		c.Get(events.TypeAttemptPlaced), c.Get(events.TypeSlotReleased), total, time.Since(last).Round(time.Millisecond), r.f.RunnerFailures())
}

func (r *scaleRun) progress() int64 { t, _ := r.c.Total(); return t }

// fillUp enqueues the fill and waits until every job of it runs at once; it
// returns how long that took and which job ids are the fill's (the rest
// are probes).
func (r *scaleRun) fillUp(ctx context.Context, fill []ghsim.JobSpec) (time.Duration, map[int64]bool, error) {
	start := time.Now()
	isFill := map[int64]bool{}
	for _, s := range fill {
		id, err := r.f.Enqueue(ctx, s)
		if err != nil {
			return 0, nil, err
		}
		isFill[id] = true
	}
	full := func() bool { return r.c.Get(events.TypeJobInProgress) >= int64(r.o.Jobs) }
	if err := Wait(ctx, "scale fill", r.e.Timeout, r.e.Stall, full, r.progress, r.status); err != nil {
		return 0, nil, fmt.Errorf("%w\n%s", err, diagnose(ctx, r.f))
	}
	filled := time.Since(start)
	if n := r.c.Get(events.TypeJobCompleted); n > 0 {
		return 0, nil, fmt.Errorf("scale: %d jobs finished before all %d ran at once (the fill took %s); raise -scale-duration", n, r.o.Jobs, filled.Round(time.Second))
	}
	return filled, isFill, nil
}

// probe offers the probes at the unloaded rate while the fill runs, and
// waits until they are served, with the CPU profile (if asked for) covering
// just that window. It returns when the probes started and were done.
func (r *scaleRun) probe(ctx context.Context, probes []ghsim.JobSpec) (start, done time.Time, err error) {
	stopProfile, err := r.cpuProfile(ctx)
	if err != nil {
		return start, done, err
	}
	defer stopProfile() // on a failed wait; stopping twice is harmless
	stopTrace, err := execTrace(r.o.Trace)
	if err != nil {
		return start, done, err
	}
	defer stopTrace()
	cpu, err := r.cpu(ctx)
	if err != nil {
		return start, done, err
	}
	start = time.Now()
	for i, s := range probes {
		if d := time.Until(start.Add(time.Duration(float64(i) / float64(r.rate) * float64(time.Second)))); d > 0 {
			time.Sleep(d)
		}
		if _, err := r.f.Enqueue(ctx, s); err != nil {
			return start, done, err
		}
	}
	probed := func() bool { return r.c.Get(events.TypeJobCompleted) >= int64(r.o.Probes) }
	if err := Wait(ctx, "scale probes", r.e.Timeout, r.e.Stall, probed, r.progress, r.status); err != nil {
		return start, done, fmt.Errorf("%w\n%s", err, diagnose(ctx, r.f))
	}
	done = time.Now()
	stopProfile()
	stopTrace()
	after, err := r.cpu(ctx)
	if err != nil {
		return start, done, err
	}
	r.probeCPU = [2]float64{cores(after[0]-cpu[0], done.Sub(start)), cores(after[1]-cpu[1], done.Sub(start))}
	return start, done, nil
}

// cpuProfile starts the CPU profile of this process into
// ScaleOptions.CPUProfile and, with the world apart, of the world process
// into the same name with ".world" added; it returns their stop.
func (r *scaleRun) cpuProfile(ctx context.Context) (stop func(), err error) {
	stopHere, err := cpuProfile(r.o.CPUProfile)
	if err != nil || r.o.CPUProfile == "" || r.f.world == nil {
		return stopHere, err
	}
	if err := r.f.world.call(ctx, http.MethodPost, "/cpuprofile?file="+url.QueryEscape(r.o.CPUProfile+".world"), nil, nil); err != nil {
		stopHere()
		return nil, err
	}
	return func() {
		stopHere()
		_ = r.f.world.call(context.Background(), http.MethodDelete, "/cpuprofile", nil, nil)
	}, nil
}

// cpu is the CPU time this process and the world process (0 when there is
// none) have used.
func (r *scaleRun) cpu(ctx context.Context) ([2]time.Duration, error) {
	here := processCPU()
	if r.f.world == nil {
		return [2]time.Duration{here, 0}, nil
	}
	s, err := r.f.world.state(ctx, false)
	return [2]time.Duration{here, s.CPU}, err
}

// cores is CPU time used over a wall-clock span, in cores.
func cores(cpu, wall time.Duration) float64 { return cpu.Seconds() / max(wall.Seconds(), 1e-9) }

// cpuNote says how busy each process was while the probes were served:
// on a machine of few cores, a collector's mark phase then has no idle
// core to run on.
func (r *scaleRun) cpuNote() string {
	if r.f.world == nil {
		return fmt.Sprintf("CPU while the probes were served: %.2f cores (of %d)", r.probeCPU[0], runtime.NumCPU())
	}
	return fmt.Sprintf("CPU while the probes were served: %.2f cores in this process (the dispatcher, the watchdog and NATS), %.2f in the world process (agents and simulator), of %d",
		r.probeCPU[0], r.probeCPU[1], runtime.NumCPU())
}

// drain waits until every job and probe has settled, then reads the run's
// log (after base) into a timeline; it returns the log's last sequence too.
func (r *scaleRun) drain(ctx context.Context, base uint64) (uint64, Timeline, error) {
	o := r.o
	// Nothing is logged while the jobs run: the stall clock allows for that.
	settled := func() bool { return r.c.Settled(int64(o.Jobs + o.Probes)) }
	if err := Wait(ctx, "scale drain", r.e.Timeout+o.Duration, r.e.Stall+o.Duration, settled, r.progress, r.status); err != nil {
		return 0, Timeline{}, fmt.Errorf("%w\n%s", err, diagnose(ctx, r.f))
	}
	last, err := LastSeq(ctx, r.f.JS)
	if err != nil {
		return 0, Timeline{}, err
	}
	log, err := ReadLog(ctx, r.f.JS, base+1, last, time.Minute)
	if err != nil {
		return 0, Timeline{}, err
	}
	return last, BuildTimeline(log), nil
}

// splitTimeline parts the run's jobs into the fill's and the probes'.
func splitTimeline(tl Timeline, isFill map[int64]bool) (fill, probes Timeline) {
	fill, probes = Timeline{Jobs: map[int64]*JobTimes{}}, Timeline{Jobs: map[int64]*JobTimes{}}
	for id, j := range tl.Jobs {
		if isFill[id] {
			fill.Jobs[id] = j
		} else {
			probes.Jobs[id] = j
		}
	}
	return fill, probes
}

// firstCompleted is when the first job of tl completed: the probes ran
// under the full load only if the fill's first end came after them.
func firstCompleted(tl Timeline) (first time.Time) {
	for _, j := range tl.Jobs {
		if !j.Completed.IsZero() && (first.IsZero() || j.Completed.Before(first)) {
			first = j.Completed
		}
	}
	return first
}

// scaleShare compares the probes' part before the GitHub call with the
// same part unloaded: what the full fleet costs Berth's own path, apart
// from the simulator's answers (GitHub's, in production).
func (e Env) scaleShare(d Dist) Row {
	row := Row{Figure: "Scale: the probes' part before the GitHub call (webhook accepted → slot reserved stored: consumer delivery, fold, Decide, append)",
		Value: pq(d), Reference: "no unloaded figure in this run (run the latency phase too)",
		Target: "— (the target is the whole path's, above)"}
	if u := e.Unloaded; u != nil && u.Rate > 0 && u.Reserve.N > 0 {
		row.Reference = fmt.Sprintf("unloaded, %d jobs/s in the latency phase: %s", u.Rate, pq(u.Reserve))
		row.Ratio = "p99 " + ratio(float64(d.P99), float64(u.Reserve.P99))
	}
	return row
}

// slowestProbes names the n slowest probes, each with when it was accepted
// (after the first probe was offered) and its two halves, so a tail can be
// told apart: a stall in time (clustered offsets) from one in a part (a
// half that dominates).
func slowestProbes(probes Timeline, start time.Time, n int) string {
	var slow []*JobTimes
	for _, j := range probes.Jobs {
		if !j.Queued.IsZero() && !j.Placed.IsZero() {
			slow = append(slow, j)
		}
	}
	slices.SortFunc(slow, func(a, b *JobTimes) int { return cmp.Compare(b.Placed.Sub(b.Queued), a.Placed.Sub(a.Queued)) })
	parts := make([]string, 0, n)
	for _, j := range slow[:min(n, len(slow))] {
		part := fmt.Sprintf("%s at +%.1f s", ms(j.Placed.Sub(j.Queued)), j.Queued.Sub(start).Seconds())
		// A warm VM's placement comes before any reservation: no halves.
		if !j.Reserved.IsZero() && !j.Placed.Before(j.Reserved) {
			part += fmt.Sprintf(" (accepted → reserved %s, reserved → placed %s)", ms(j.Reserved.Sub(j.Queued)), ms(j.Placed.Sub(j.Reserved)))
		}
		parts = append(parts, part)
	}
	return "the slowest probes, with when each was accepted after the first was offered: " + strings.Join(parts, "; ")
}

// fleetHeap is one heap reading of a fleet, each after two forced GCs:
// this process's, and the world process's when the simulator and the
// agents run apart (zero otherwise).
type fleetHeap struct{ here, world memPoint }

func measureFleet(ctx context.Context, f *Fleet) (fleetHeap, error) {
	h := fleetHeap{here: measure()}
	if f.world == nil {
		return h, nil
	}
	s, err := f.world.state(ctx, true)
	h.world = memPoint{heap: s.Heap, objects: s.Objects, goroutines: s.Goroutines}
	return h, err
}

// total is the heap of both processes, in bytes.
func (h fleetHeap) total() float64 { return float64(h.here.heap) + float64(h.world.heap) }

// scaleHeaps are the heap readings of one run: before the fill, with every
// job running, once all finished, and then with the simulator closed.
type scaleHeaps struct{ idle, loaded, after, noSim fleetHeap }

// rows are the phase's four figures: fill time, loaded dispatch latency,
// heap per running job and heap per finished job.
func (r *scaleRun) rows(filled time.Duration, fill, probes Timeline, h scaleHeaps) []Row {
	toReserve, _ := probes.PlaceParts()
	o := r.o
	n := float64(o.Jobs + o.Probes)
	simBytes := (h.after.total() - h.noSim.total()) / n // per job at the end
	perDone := (h.noSim.total() - h.idle.total()) / n
	return []Row{
		{Figure: fmt.Sprintf("Scale: fill, %d jobs at once on %d hosts (first enqueue → the last one running)", o.Jobs, o.Hosts),
			Value: ms(filled), Reference: fmt.Sprintf("%d slots offered; %s", (o.LinuxSlots+o.MacSlots)*o.Hosts, pq(Summarize(fill.PlaceLatency()))+" webhook → placement"),
			Target: "—"},
		r.e.scaleLatency(Summarize(probes.PlaceLatency()), o, r.rate, r.where()),
		r.e.scaleShare(Summarize(toReserve)),
		r.liveHeapRow(h, simBytes),
		{Figure: "Scale: heap per finished job once all finished, settled and quiet, the simulator closed (Berth, its agents included, and NATS)",
			Value:     bytesStr(perDone),
			Reference: fmt.Sprintf("heap before the fill: %s", bytesStr(h.idle.total())),
			Target:    historyTarget(perDone, o)},
	}
}

// where says where the simulator and the agents ran.
func (r *scaleRun) where() string {
	switch {
	case r.f.world == nil:
		return "the simulator and the agents in this process"
	case r.e.WorldProcs > 0:
		return fmt.Sprintf("the simulator and the agents in a process of their own on %d of the %d cores", r.e.WorldProcs, runtime.NumCPU())
	}
	return "the simulator and the agents in a process of their own"
}

// liveHeapRow is the heap each running job costs. With the world apart it
// is the control plane's process alone (the dispatcher, the watchdog and
// NATS), the world's figure beside it; else the whole process, whose
// share of the simulator cannot be taken out while the jobs run.
func (r *scaleRun) liveHeapRow(h scaleHeaps, simBytes float64) Row {
	jobs := float64(r.o.Jobs)
	if r.f.world == nil {
		return Row{Figure: fmt.Sprintf("Scale: heap per running job with %d running, whole process with the simulator (after a forced GC, twice)", r.o.Jobs),
			Value:     bytesStr((h.loaded.total() - h.idle.total()) / jobs),
			Reference: fmt.Sprintf("heap before the fill: %s; the simulator keeps %s a job at the end", bytesStr(h.idle.total()), bytesStr(simBytes)),
			Target:    "memory proportional to live jobs"}
	}
	return Row{Figure: fmt.Sprintf("Scale: heap per running job with %d running, the control plane's process: dispatcher, watchdog and NATS (after a forced GC, twice)", r.o.Jobs),
		Value: bytesStr((float64(h.loaded.here.heap) - float64(h.idle.here.heap)) / jobs),
		Reference: fmt.Sprintf("its heap before the fill: %s; the world process (agents and simulator): %s a running job, %s before the fill; the simulator keeps %s a job at the end",
			bytesStr(float64(h.idle.here.heap)), bytesStr((float64(h.loaded.world.heap)-float64(h.idle.world.heap))/jobs), bytesStr(float64(h.idle.world.heap)), bytesStr(simBytes)),
		Target: "memory proportional to live jobs"}
}

// scaleLatency compares the probes' dispatch latency, with the fleet full,
// with the unloaded figure of the same run (issue 9: p99 within 2× of it,
// with 10,000 concurrent jobs on 500 hosts).
func (e Env) scaleLatency(d Dist, o ScaleOptions, rate int, where string) Row {
	row := Row{Figure: fmt.Sprintf("Scale: dispatch latency of %d jobs at %d jobs/s while %d run on %d hosts, %s (webhook accepted → placement stored)", d.N, rate, o.Jobs, o.Hosts, where),
		Value: pq(d), Reference: "no unloaded figure in this run (run the latency phase too)"}
	if u := e.Unloaded; u != nil && u.Rate > 0 {
		row.Reference = fmt.Sprintf("unloaded, %d jobs/s in the latency phase: %s", u.Rate, pq(u.Dist))
		row.Ratio = "p99 " + ratio(float64(d.P99), float64(u.Dist.P99))
	}
	const goal = "p99 ≤ 2× unloaded with 10,000 concurrent jobs on 500 hosts"
	switch {
	case o.Jobs < 10000 || o.Hosts < 500:
		row.Target = fmt.Sprintf("%s: not measured at that size here (BENCH_FLAGS='-phases latency,scale -scale-jobs 10000 -scale-hosts 500 -scale-linux-slots 16 -scale-mac-slots 8 -scale-duration 2m30s')", goal)
	case e.Unloaded == nil || e.Unloaded.Rate == 0:
		row.Target = goal + ": no unloaded figure to compare with"
	default:
		row.Target = target(goal, d.P99 <= 2*e.Unloaded.Dist.P99)
	}
	return row
}

// historyTarget judges the heap a finished job leaves behind only at the
// issue's size: a small run's heap moves by more than it holds (it can
// even fall), and "met" would not follow from the figure.
func historyTarget(perDone float64, o ScaleOptions) string {
	const goal = "not proportional to history: ≤ 64 B per finished job (target 4)"
	if o.Jobs < 10000 || perDone < 0 {
		return goal + ": not judged at that size (a small run's heap moves by more than it holds)"
	}
	return target(goal, perDone <= 64)
}
