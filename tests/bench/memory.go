package bench

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/nats-io/nats.go/jetstream"
)

// MemoryOptions size the memory phase.
type MemoryOptions struct {
	Warmup, Jobs   int
	HeapProfileDir string // write heap profiles before and after here when not ""
	// HeapOwners: the process samples allocations from its start
	// (runtime.MemProfileRate, every one when 1), so the heap is parted
	// by owner.
	HeapOwners bool
	// AfterFirstSnapshots: the measure before the jobs waits for every
	// service's first snapshot (firstSnapshots: a minute after each
	// started), then runs the warm-up again; the smoke run, whose per-job
	// figures mean nothing, does not wait.
	AfterFirstSnapshots bool
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
	// With AfterFirstSnapshots the warm-up runs twice: once so that every
	// service has facts to snapshot, and once more after their first
	// snapshots, since the idle minute of waiting for them closes some of
	// the connections the first opened (120 goroutines before the jobs,
	// 144 after, when measured straight after the wait).
	warmups := 1
	if o.AfterFirstSnapshots {
		warmups = 2
	}
	warm := warmups * o.Warmup
	specs := Workload(warm+o.Jobs, e.Seed+7, 0.3, 0, 20*time.Millisecond, e.BareLabel)
	fd := feed{limit: 24}
	e.say("memory: warm-up of %d jobs, then %d jobs, one agent, at most 24 unfinished", o.Warmup, o.Jobs)
	if _, err := e.drive(ctx, "memory warm-up", f, specs[:o.Warmup], fd, settled(o.Warmup)); err != nil {
		return res, err
	}
	if o.AfterFirstSnapshots {
		e.say("memory: waiting for each service's first snapshot (a minute after it started), so that the compressor it makes is in the measure before the jobs; then the warm-up again")
		if err := firstSnapshots(ctx, f.JS, snapshotKeys(f), 2*time.Minute); err != nil {
			return res, err
		}
		if _, err := e.drive(ctx, "memory warm-up", f, specs[o.Warmup:warm], fd, settled(o.Warmup)); err != nil {
			return res, err
		}
	}
	quiet()
	if err := f.Settle(ctx); err != nil {
		return res, err
	}
	before := measure()
	if err := heapProfile(o.HeapProfileDir, "heap-before.pb.gz"); err != nil {
		return res, err
	}
	heapBefore, err := ownedHeap(o.HeapOwners)
	if err != nil {
		return res, err
	}
	if _, err := e.drive(ctx, "memory", f, specs[warm:], fd, settled(o.Jobs)); err != nil {
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
	heapAfter, err := ownedHeap(o.HeapOwners)
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
	all := float64(warm + o.Jobs)
	simJob := (float64(after.heap) - float64(noSim.heap)) / all
	simObjs := (float64(after.objects) - float64(noSim.objects)) / all
	res.Rows = append(res.Rows,
		Row{Figure: fmt.Sprintf("Memory: retained heap per job over %d jobs, whole process (after a forced GC, twice)", o.Jobs),
			Value:     fmt.Sprintf("%s and %.1f objects per job", bytesStr(perJob), objs),
			Reference: fmt.Sprintf("heap after a %d-job warm-up: %s, %s objects", warm, bytesStr(float64(before.heap)), commas(int64(before.objects))),
			Ratio:     "heap ×" + fmt.Sprintf("%.2f", float64(after.heap)/float64(before.heap)),
			Target:    "flat in job count (law 5); GitLab's manager kept ~4.5 KB and 17 objects per job"},
		Row{Figure: "Memory: the same without the simulator's share (Berth's three folds and the NATS server)",
			Value:     fmt.Sprintf("%s and %.2f objects per job", bytesStr(perJob-simJob), objs-simObjs),
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
	if o.AfterFirstSnapshots {
		res.Notes = append(res.Notes, "the measure before the jobs is taken once every service has stored its first snapshot: the compressor each makes then is the service's, not the jobs'")
	}
	if o.HeapProfileDir != "" {
		res.Notes = append(res.Notes, "heap profiles: `go tool pprof -top -diff_base "+o.HeapProfileDir+"/heap-before.pb.gz "+o.HeapProfileDir+"/heap-after.pb.gz`")
	}
	if heapBefore != nil {
		res.Rows = append(res.Rows, heapByOwner(heapBefore, heapAfter, n, runtime.MemProfileRate))
	}
	return res, nil
}

// snapshotKeys names the snapshot of each of the fleet's services: the
// dispatcher, the watchdog and each agent.
func snapshotKeys(f *Fleet) []string {
	keys := []string{events.SnapshotKeyDispatcher, events.SnapshotKeyWatchdog}
	for host := range f.Sys.Agents {
		keys = append(keys, events.SnapshotKeyAgent(host))
	}
	return keys
}

// firstSnapshots waits, at most timeout, until each key of the snapshot
// bucket has been written (whole or in parts). A service makes its
// snapshot compressor with its first snapshot, a minute after it started:
// a cost of the service, not of the jobs, which a measure taken before
// then would count as theirs (about 1.5 MB for the three services).
func firstSnapshots(ctx context.Context, js jetstream.JetStream, keys []string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	kv, err := js.KeyValue(ctx, events.BucketSnapshots)
	if err != nil {
		return fmt.Errorf("memory: snapshot bucket: %w", err)
	}
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("memory: watching the snapshot bucket: %w", err)
	}
	defer func() { _ = w.Stop() }()
	left := map[string]bool{}
	for _, k := range keys {
		left[k] = true
	}
	for len(left) > 0 {
		select {
		case u := <-w.Updates():
			if u == nil {
				continue // the values stored before the watch have all come
			}
			for k := range left {
				if u.Key() == k || strings.HasPrefix(u.Key(), k+".") {
					delete(left, k)
				}
			}
		case <-ctx.Done():
			return fmt.Errorf("memory: no snapshot from %v within %s: is each service's loop caught up?", slices.Sorted(maps.Keys(left)), timeout)
		}
	}
	return nil
}

// ownedHeap is the heap by owner when allocations are sampled from the
// process's start (-heap-owners), else nil: exact when every one is, the
// profile's estimate otherwise.
func ownedHeap(owners bool) (HeapShares, error) {
	if !owners {
		return nil, nil
	}
	var buf bytes.Buffer
	if err := pprof.Lookup("heap").WriteTo(&buf, 0); err != nil {
		return nil, err
	}
	return HeapSharesOf(buf.Bytes())
}

// heapByOwner is the heap retained per job by each part, from heap
// profiles taken beside the before and after measures, sampled one
// allocation each rate bytes (1: every one).
func heapByOwner(before, after HeapShares, jobs float64, rate int) Row {
	per := func(p Part) string {
		d := after[p]
		b := before[p]
		return fmt.Sprintf("%s, %.1f objects", bytesStr(float64(d[0]-b[0])/jobs), float64(d[1]-b[1])/jobs)
	}
	berth := float64(after[PartBerth][0]-before[PartBerth][0]) / jobs
	objs := float64(after[PartBerth][1]-before[PartBerth][1]) / jobs
	how := "every allocation sampled"
	if rate > 1 {
		how = fmt.Sprintf("estimated from allocations sampled one each %d B", rate)
	}
	return Row{Figure: "Memory: retained per job by owner, " + how + " (-heap-owners): Berth's folds and services",
		Value:     fmt.Sprintf("%s and %.2f objects per job", bytesStr(berth), objs),
		Reference: fmt.Sprintf("NATS server %s; simulator %s; runtime %s", per(PartNATS), per(PartSim), per(PartOther)),
		Target:    target("≤ 64 B and ≤ 0.1 heap objects per job", berth <= 64 && objs <= 0.1)}
}
