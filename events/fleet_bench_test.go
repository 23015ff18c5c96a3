package events_test

import (
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
)

// Benchmarks of the fold: what every service pays per fact, per status read
// and per label match. `make bench` runs them with -benchmem; the numbers
// land in BENCHMARKS.md.

var benchPools = map[string][]string{
	"linux": {"self-hosted", "linux", "x64"},
	"macos": {"self-hosted", "macos", "arm64"},
}

// benchJobLabels are runs-on sets as workflows write them (mixed case, subsets).
var benchJobLabels = [][]string{
	{"self-hosted", "linux"}, {"self-hosted", "Linux", "X64"}, {"self-hosted", "linux", "x64"},
	{"self-hosted", "macOS"}, {"self-hosted", "macos", "ARM64"},
}

// sealed stands in for a sealed JIT config: the simulator's encoded config
// sealed to a curve key is about 300 bytes.
var sealed = make([]byte, 300)

// benchHosts are the facts that bring n hosts online, each offering both pools.
func benchHosts(n int, slots int) []events.Payload {
	var out []events.Payload
	for i := 0; i < n; i++ {
		h := "host-" + strconv.Itoa(i)
		o := events.HostOnline{Host: h, Boot: "boot-1", PhysicalCap: 2 * slots, CurveKey: "X" + h, Backend: "bench",
			Pools: map[string]events.PoolSlots{
				"linux": {Labels: benchPools["linux"], Slots: slots},
				"macos": {Labels: benchPools["macos"], Slots: slots},
			}}
		g := events.GrantClaim(o)
		out = append(out, &o, &g)
	}
	return out
}

// stage is how far a job's lifecycle has gone.
type stage int

const (
	stageQueued stage = iota + 1
	stageRunning
	stageDone
)

// benchLifecycle returns the facts of job id up to stage st, in the order the
// services append them: a full lifecycle is ten facts.
func benchLifecycle(id int64, host string, st stage) []events.Payload {
	labels := benchJobLabels[id%int64(len(benchJobLabels))]
	pool := events.MatchPool(labels, benchPools)
	// Delivery ids are UUIDs, as GitHub's are: one per webhook.
	ref := events.JobRef{Delivery: fmt.Sprintf("%08x-0000-4000-8000-%012x", id, id), JobID: id, RunID: 7000 + id, RunAttempt: 1,
		Org: "example-org", Repo: "example-repo", Name: "build (" + strconv.FormatInt(id%7, 10) + ")", Labels: labels}
	att := events.AttemptID(id, 1)
	ar := events.AttemptRef{Attempt: att, Pool: pool, Host: host}
	out := []events.Payload{&events.JobQueued{JobRef: ref}}
	if st < stageRunning {
		return out
	}
	inProgress := ref
	inProgress.Delivery = fmt.Sprintf("%08x-0001-4000-8000-%012x", id, id)
	out = append(out,
		&events.SlotReserved{Pool: pool, Host: host, Attempt: att, JobID: id, N: 1, Labels: benchPools[pool]},
		&events.AttemptPlaced{AttemptRef: ar, JobID: id, Labels: benchPools[pool], RunnerID: 100 + id, SealedJIT: sealed, SealedBy: "XDISPATCHER", SealedTo: "X" + host},
		&events.AttemptProvisioning{AttemptRef: ar},
		&events.AttemptRunnerStarted{AttemptRef: ar, Took: 40 * time.Millisecond},
		&events.JobInProgress{JobRef: inProgress, RunnerName: att, RunnerID: 100 + id},
	)
	if st < stageDone {
		return out
	}
	completed := ref
	completed.Delivery = fmt.Sprintf("%08x-0002-4000-8000-%012x", id, id)
	return append(out,
		&events.JobCompleted{JobRef: completed, Conclusion: "success", RunnerName: att, RunnerID: 100 + id},
		&events.SlotReleased{Pool: pool, Host: host, Attempt: att, Reason: events.ReleaseCompleted, JobID: id},
		&events.AttemptTeardownRequested{AttemptRef: ar, Reason: events.ReleaseCompleted},
		&events.AttemptStopped{AttemptRef: ar},
	)
}

// benchLog numbers facts as the stream would: seq n at t0 + n ms.
type benchLog struct {
	f *events.Fleet
	n uint64
}

func (l *benchLog) add(ps ...events.Payload) {
	for _, p := range ps {
		l.n++
		e := events.New("bench", t0.Add(time.Duration(l.n)*time.Millisecond), p)
		e.Seq = l.n
		l.f.Apply(e)
	}
}

// benchFleet folds n jobs over 10 hosts: 10% queued, 10% running, the rest
// completed and still retained (terminal records stay for the retention).
func benchFleet(n int) *events.Fleet {
	l := &benchLog{f: events.NewFleet()}
	l.add(benchHosts(10, n)...)
	for i := 0; i < n; i++ {
		st := stageDone
		switch i % 10 {
		case 0:
			st = stageQueued
		case 1:
			st = stageRunning
		}
		l.add(benchLifecycle(int64(i+1), "host-"+strconv.Itoa(i%10), st)...)
	}
	return l.f
}

// windowFleet folds 100 queued jobs, 100 running and done completed ones,
// whose whole records a fold keeps for the settle window
// (events.DefaultSettleAfter): a busy fleet's last minute.
func windowFleet(done int) *events.Fleet {
	l := &benchLog{f: events.NewFleet()}
	l.add(benchHosts(10, 200+done)...)
	for i := 0; i < 200+done; i++ {
		st := stageDone
		switch {
		case i < 100:
			st = stageQueued
		case i < 200:
			st = stageRunning
		}
		l.add(benchLifecycle(int64(i+1), "host-"+strconv.Itoa(i%10), st)...)
	}
	return l.f
}

// BenchmarkApplyLifecycle folds one job's ten facts per op into a fleet that
// keeps every job (as it does within the retention), and reports the heap the
// fold retains per job after a forced GC. The facts are made by encoding and
// decoding, off the clock, so they own their memory as delivered facts do.
func BenchmarkApplyLifecycle(b *testing.B) { benchLifecycles(b, false, false) }

// BenchmarkSettledLifecycle is BenchmarkApplyLifecycle with the jobs
// settled afterwards (Compact an hour after the last, at the default 72 h
// retention): what a finished job costs once only its ids are left (issue
// 19: a few bytes, not a record). The dispatcher's fold: its three webhook
// delivery ids are 48 of those bytes.
func BenchmarkSettledLifecycle(b *testing.B) { benchLifecycles(b, true, false) }

// BenchmarkSettledLifecycleNoDeliveries is BenchmarkSettledLifecycle for a
// fold that keeps no delivery ids (DropDeliveryIDs): the watchdog's.
func BenchmarkSettledLifecycleNoDeliveries(b *testing.B) { benchLifecycles(b, true, true) }

func benchLifecycles(b *testing.B, settle, dropDeliveries bool) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&before)
	f, seq := hostsFleet()
	if dropDeliveries {
		f.DropDeliveryIDs()
	}
	const chunk = 1024
	var batch []events.Event
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%chunk == 0 {
			b.StopTimer()
			batch = batch[:0]
			for j := i; j < i+chunk && j < b.N; j++ {
				for _, p := range benchLifecycle(int64(j+1), "host-"+strconv.Itoa(j%10), stageDone) {
					seq++
					batch = append(batch, decoded(b, events.New("berth/bench", t0.Add(time.Duration(seq)*time.Millisecond), p), seq))
				}
			}
			b.StartTimer()
		}
		for _, e := range batch[(i%chunk)*10 : (i%chunk)*10+10] {
			f.Apply(e)
		}
		if i%chunk == chunk-1 {
			f.LiveCounts() // a decision round reads the live index, and so keeps it built
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*10), "ns/event")
	batch = nil
	if settle {
		f.Compact(t0.Add(time.Duration(seq)*time.Millisecond+time.Hour), 72*time.Hour)
		if jobs, _ := f.SettledCounts(); jobs != b.N {
			b.Fatalf("%d jobs settled after %d lifecycles", jobs, b.N)
		}
	}
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	if jobs, _ := f.SettledCounts(); len(f.Jobs)+jobs != b.N {
		b.Fatalf("fleet holds %d jobs after %d lifecycles", len(f.Jobs)+jobs, b.N)
	}
	b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(b.N), "retained-B/job")
	b.ReportMetric(float64(int64(after.HeapObjects)-int64(before.HeapObjects))/float64(b.N), "retained-objs/job")
	runtime.KeepAlive(f)
}

// hostsFleet is a fold of ten hosts of 100 slots, and the sequence of its
// last fact.
func hostsFleet() (*events.Fleet, uint64) {
	f := events.NewFleet()
	seq := uint64(0)
	for _, h := range benchHosts(10, 100) {
		seq++
		e := events.New("bench", t0, h)
		e.Seq = seq
		f.Apply(e)
	}
	return f, seq
}

// decoded round-trips a fact through its stored form.
func decoded(b testing.TB, e events.Event, seq uint64) events.Event {
	bs, err := events.Marshal(e)
	if err != nil {
		b.Fatal(err)
	}
	d, err := events.Unmarshal(bs, seq)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// BenchmarkUnmarshalLifecycle decodes one job's ten stored envelopes per op:
// what a follower pays before the fold (replay is this plus Apply).
func BenchmarkUnmarshalLifecycle(b *testing.B) {
	var raw [][]byte
	for _, p := range benchLifecycle(42, "host-1", stageDone) {
		bs, err := events.Marshal(events.New("berth/bench", t0, p))
		if err != nil {
			b.Fatal(err)
		}
		raw = append(raw, bs)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j, bs := range raw {
			if _, err := events.Unmarshal(bs, uint64(j+1)); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(raw)), "ns/event")
}

// BenchmarkMarshalLifecycle encodes one job's ten facts per op: what the
// services pay per append before the publish.
func BenchmarkMarshalLifecycle(b *testing.B) {
	var evs []events.Event
	for _, p := range benchLifecycle(42, "host-1", stageDone) {
		evs = append(evs, events.New("berth/bench", t0, p))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, e := range evs {
			if _, err := events.Marshal(e); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(evs)), "ns/event")
}

// BenchmarkStatus derives the operator's view from fleets of growing size:
// whole (the page, /status, the CLI), and as counts alone (StatusCounts:
// the dispatcher's metrics and the watchdog's health, once a second).
func BenchmarkStatus(b *testing.B) {
	views := []struct {
		name string
		read func(*events.Fleet) events.Status
	}{{"", (*events.Fleet).Status}, {"counts/", (*events.Fleet).StatusCounts}}
	for _, n := range []int{100, 1000, 10000} {
		for _, v := range views {
			b.Run(v.name+"jobs="+strconv.Itoa(n), func(b *testing.B) {
				f := benchFleet(n)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					_ = v.read(f)
				}
			})
		}
	}
	// The same 200 live jobs behind a growing settle window: a status
	// costs what is live, not what the fold keeps.
	for _, done := range []int{1000, 100000} {
		for _, v := range views {
			b.Run(v.name+"live=200/done="+strconv.Itoa(done), func(b *testing.B) {
				f := windowFleet(done)
				_ = v.read(f) // the live index is built on first read
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					_ = v.read(f)
				}
			})
		}
	}
}

// BenchmarkMatchPool matches a job's runs-on labels against the advertised
// pools, as Decide and Status do for every queued job.
func BenchmarkMatchPool(b *testing.B) {
	many := map[string][]string{}
	for i := 0; i < 18; i++ {
		many["pool-"+strconv.Itoa(i)] = []string{"self-hosted", "linux", "x64", "gpu-" + strconv.Itoa(i)}
	}
	for name, l := range benchPools {
		many[name] = l
	}
	for _, c := range []struct {
		name  string
		pools map[string][]string
	}{{"pools=2", benchPools}, {"pools=20", many}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if events.MatchPool(benchJobLabels[i%len(benchJobLabels)], c.pools) == "" {
					b.Fatal("no pool matched")
				}
			}
		})
	}
}

// BenchmarkDecisionIndexes is what a decision round pays to read the fold's
// indexes (issue 19) with a backlog of n queued jobs and 500 hosts: one job
// queued and one taken per op (the index moves twice), then the pool's
// demand count, its oldest job, and the hosts with room. It should not grow
// with n.
func BenchmarkDecisionIndexes(b *testing.B) {
	for _, n := range []int{1000, 10000, 100000} {
		b.Run("backlog="+strconv.Itoa(n), func(b *testing.B) {
			l := &benchLog{f: events.NewFleet()}
			l.add(benchHosts(500, 16)...)
			for i := 0; i < n; i++ {
				l.add(benchLifecycle(int64(i+1), "", stageQueued)...)
			}
			next := int64(n + 1)
			f := l.f
			f.DemandCount("linux") // builds the indexes, off the clock
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				l.add(benchLifecycle(next, "", stageQueued)...)
				l.add(&events.JobInProgress{JobRef: events.JobRef{JobID: next - int64(n), RunID: 1}, RunnerName: "other"})
				next++
				if f.DemandCount("linux") == 0 {
					b.Fatal("no demand")
				}
				for range f.DemandOldest("linux") {
					break
				}
				for range f.HostsWithRoom("linux") {
					break
				}
			}
		})
	}
}

// BenchmarkMarshalSnapshot marshals a fold holding the whole records of
// jobs that ended less than DefaultSettleAfter ago (a busy fleet's last
// minute): the work a service's loop does at each snapshot. "bytes"
// is MarshalSnapshot, the whole text in one buffer (what a restart test
// or the bench stores); "streamed" is what a service does: the fold
// frozen, then encoded in pieces into a writer (a compressor; here one
// that only counts), so its B/op is what encoding itself allocates.
func BenchmarkMarshalSnapshot(b *testing.B) {
	for _, mode := range []string{"bytes", "streamed"} {
		for _, n := range []int{1000, 10000} {
			b.Run(mode+"/jobs="+strconv.Itoa(n), func(b *testing.B) {
				f, seq := hostsFleet()
				for j := 0; j < n; j++ {
					for _, p := range benchLifecycle(int64(j+1), "host-"+strconv.Itoa(j%10), stageDone) {
						seq++
						f.Apply(decoded(b, events.New("berth/bench", t0.Add(time.Duration(seq)*time.Millisecond), p), seq))
					}
				}
				b.ReportAllocs()
				b.ResetTimer()
				var size int
				for i := 0; i < b.N; i++ {
					if mode == "bytes" {
						s, err := events.MarshalSnapshot(f)
						if err != nil {
							b.Fatal(err)
						}
						size = len(s)
						continue
					}
					z, err := events.FreezeSnapshot(f)
					if err != nil {
						b.Fatal(err)
					}
					var w counter
					if err := z.Encode(&w); err != nil {
						b.Fatal(err)
					}
					size = w.n
				}
				b.ReportMetric(float64(size)/float64(n), "B/job")
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/job")
			})
		}
	}
}

// BenchmarkFreezeSnapshot is the part of a snapshot that a service's loop
// waits for: copying a fold of n running jobs, 20 on each host (the scale
// bench's shape: 10,000 on 500 hosts), so that it may be encoded
// elsewhere while the loop goes on (FreezeSnapshot).
func BenchmarkFreezeSnapshot(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run("running="+strconv.Itoa(n), func(b *testing.B) {
			f, seq := events.NewFleet(), uint64(0)
			for _, h := range benchHosts(n/20, 24) {
				seq++
				f.Apply(decoded(b, events.New("berth/bench", t0, h), seq))
			}
			for j := 0; j < n; j++ {
				for _, p := range benchLifecycle(int64(j+1), "host-"+strconv.Itoa(j%(n/20)), stageRunning) {
					seq++
					f.Apply(decoded(b, events.New("berth/bench", t0.Add(time.Duration(seq)*time.Millisecond), p), seq))
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := events.FreezeSnapshot(f); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// counter is a writer that keeps only how much it was given, and the
// largest piece.
type counter struct{ n, largest int }

func (c *counter) Write(p []byte) (int, error) {
	c.n += len(p)
	c.largest = max(c.largest, len(p))
	return len(p), nil
}

// BenchmarkCompactWhileRunning is one compaction of a fold holding n jobs
// that all run (nothing can settle): what each compaction Fleet.CompactDue
// adds on a service's loop while a fleet fills, once per KeepOver records
// (10 times on the way to 10,000 running jobs), besides the one a minute.
func BenchmarkCompactWhileRunning(b *testing.B) {
	for _, n := range []int{1_000, 10_000} {
		b.Run("jobs="+strconv.Itoa(n), func(b *testing.B) {
			l := &benchLog{f: events.NewFleet()}
			l.add(benchHosts(10, n)...)
			for i := 0; i < n; i++ {
				l.add(benchLifecycle(int64(i+1), "host-"+strconv.Itoa(i%10), stageRunning)...)
			}
			now := t0.Add(time.Duration(l.n+1) * time.Millisecond)
			b.ReportAllocs()
			for b.Loop() {
				if jobs, attempts := l.f.Compact(now, 72*time.Hour); jobs != 0 || attempts != 0 {
					b.Fatalf("settled %d jobs and %d attempts of a fleet where all run", jobs, attempts)
				}
				l.f.LiveCounts() // the next round reads the live index
			}
		})
	}
}
