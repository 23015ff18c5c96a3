package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/pprof/profile"

	"github.com/berth-ci/berth/events"
)

// tenth is what one tenth of a run's released slots cost: how long it
// took, the CPU this process and the rest of the machine used meanwhile,
// and this process's CPU profile over it.
type tenth struct {
	Released int64         // slots released when it ended (the flatness row's measure)
	Wall     time.Duration // how long it lasted
	CPU      time.Duration // this process's CPU (user + system)
	Machine  time.Duration // every process's CPU on the machine, from /proc/stat; 0 where unreadable
	GC       time.Duration // CPU the Go collector took, its assists included (runtime/metrics)
	HeapLive uint64        // bytes the last collection marked live when the tenth ended
	Heap     []byte        // the heap profile when the tenth ended (sampled: runtime.MemProfileRate)
	Profile  []byte        // this process's CPU profile over the tenth
}

// Others is the CPU the rest of the machine used during the tenth: a run
// on a shared machine slows when another process takes its cores, and
// this says so where the process's own cost did not grow.
func (t tenth) Others() time.Duration { return max(t.Machine-t.CPU, 0) }

// tenths profiles a run a tenth at a time: at each tenth of jobs released
// slots it stops the CPU profile and starts the next, so the first and the
// last tenths' profiles can be compared (issue 19: what slows a run's last
// tenth); the last tenth ends with the jobs-th release, or at Stop if that
// comes first. Its watch goroutine polls the counter every 5 ms.
type tenths struct {
	jobs  int64
	mu    sync.Mutex
	done  []tenth
	stop  chan struct{}
	ended chan struct{}
}

// profileTenths starts the first tenth's profile and the watcher; it
// returns nil when the process's CPU profile is already taken (-cpuprofile
// from the command line), and the caller then profiles the run whole.
func profileTenths(c *Counter, jobs int) *tenths {
	t := &tenths{jobs: int64(jobs), stop: make(chan struct{}), ended: make(chan struct{})}
	buf := &bytes.Buffer{}
	if err := pprof.StartCPUProfile(buf); err != nil {
		return nil
	}
	go t.watch(c, buf)
	return t
}

func (t *tenths) watch(c *Counter, buf *bytes.Buffer) {
	defer close(t.ended)
	start, cpu0, mach0 := time.Now(), processCPU(), machineCPU()
	gc0, _ := gcCPU()
	next := int64(1)
	cut := func(released int64) {
		pprof.StopCPUProfile()
		now, cpu, mach := time.Now(), processCPU(), machineCPU()
		gc, live := gcCPU()
		var heap bytes.Buffer
		_ = pprof.Lookup("heap").WriteTo(&heap, 0) // a bytes.Buffer does not fail
		t.mu.Lock()
		t.done = append(t.done, tenth{Released: released, Wall: now.Sub(start), CPU: cpu - cpu0, Machine: mach - mach0,
			GC: gc - gc0, HeapLive: live, Heap: heap.Bytes(), Profile: buf.Bytes()})
		t.mu.Unlock()
		start, cpu0, mach0, gc0 = now, cpu, mach, gc
		buf = &bytes.Buffer{}
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-t.stop: // the run ended short of its jobs, or failed
			cut(c.Get(events.TypeSlotReleased))
			return
		case <-tick.C:
		}
		released := c.Get(events.TypeSlotReleased)
		if next == 10 && released >= t.jobs {
			// The run is over: what the phase does next (reading the
			// whole log back) is not the last tenth's.
			cut(released)
			<-t.stop
			return
		}
		if next < 10 && released >= next*t.jobs/10 {
			cut(released)
			next++
			if err := pprof.StartCPUProfile(buf); err != nil {
				return // cannot happen: this goroutine stopped the only profile
			}
		}
	}
}

// Stop ends the last tenth's profile and returns every tenth, in order.
func (t *tenths) Stop() []tenth {
	close(t.stop)
	<-t.ended
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.done
}

// mergeProfiles joins the tenths' profiles into one, for the run's whole
// figures and -cpuprofile.
func mergeProfiles(ts []tenth) ([]byte, error) {
	var ps []*profile.Profile
	for _, t := range ts {
		p, err := profile.Parse(bytes.NewReader(t.Profile))
		if err != nil {
			return nil, fmt.Errorf("read a tenth's CPU profile: %w", err)
		}
		ps = append(ps, p)
	}
	merged, err := profile.Merge(ps)
	if err != nil {
		return nil, fmt.Errorf("merge the tenths' CPU profiles: %w", err)
	}
	var out bytes.Buffer
	if err := merged.Write(&out); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// tenthLine describes one tenth: its rate, the process's CPU a lifecycle
// by owner, its cores and the rest of the machine's.
func tenthLine(i int, t tenth, prev int64) (string, error) {
	n := t.Released - prev
	s, err := SharesOf(t.Profile)
	if err != nil {
		return "", err
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(max(n, 1)) }
	line := fmt.Sprintf("tenth %d: %d slots released in %s, %s jobs/s; CPU a lifecycle %.2f ms (Berth %.2f, NATS server %.2f, simulator %.2f, runtime %.2f; the collector %.2f of it, assists included); heap live %d MiB; this process %.2f cores",
		i+1, n, ms(t.Wall), num(rate(float64(n), t.Wall)), per(t.CPU), per(s[PartBerth]), per(s[PartNATS]), per(s[PartSim]), per(s[PartOther]),
		per(t.GC), t.HeapLive>>20, t.CPU.Seconds()/max(t.Wall.Seconds(), 1e-9))
	if t.Machine > 0 {
		line += fmt.Sprintf(", other processes %.2f cores", t.Others().Seconds()/max(t.Wall.Seconds(), 1e-9))
	}
	if h, err := HeapSharesOf(t.Heap); err == nil {
		line += fmt.Sprintf("; heap in use by owner, sampled: Berth %d MiB, NATS server %d MiB, simulator %d MiB, other %d MiB",
			h[PartBerth][0]>>20, h[PartNATS][0]>>20, h[PartSim][0]>>20, h[PartOther][0]>>20)
	}
	return line, nil
}

// gcCPU is the CPU the Go collector has taken in this process (its
// workers and the assists it charged to allocating goroutines; an
// estimate the runtime keeps, runtime/metrics), and the heap its last
// cycle marked live.
func gcCPU() (time.Duration, uint64) {
	ms := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}, {Name: "/gc/heap/live:bytes"}}
	metrics.Read(ms)
	var cpu time.Duration
	var live uint64
	if ms[0].Value.Kind() == metrics.KindFloat64 {
		cpu = time.Duration(ms[0].Value.Float64() * float64(time.Second))
	}
	if ms[1].Value.Kind() == metrics.KindUint64 {
		live = ms[1].Value.Uint64()
	}
	return cpu, live
}

// machineCPU is the busy CPU time of every core since boot, from the first
// line of /proc/stat (user, nice, system, irq, softirq and steal, in
// USER_HZ ticks, which Linux fixes at 100 a second for user space); 0
// where it cannot be read.
func machineCPU() time.Duration {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		return 0
	}
	return busyTicks(line) * (time.Second / 100)
}

// busyTicks sums the busy fields of /proc/stat's "cpu" line: user, nice,
// system, irq, softirq, steal (proc(5)); idle and iowait are not busy, and
// guest time is already counted in user.
func busyTicks(line string) time.Duration {
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0
		}
		busy += v
	}
	return time.Duration(busy)
}
