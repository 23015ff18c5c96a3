// Package chaos is the chaos test (issue 4): Berth as real processes on a
// 3-node NATS cluster (the stream with 3 replicas), two dispatchers, two
// watchdogs and two agents, serving jobs from the GitHub simulator while a
// random part of it (a dispatcher, a watchdog, an agent or a NATS node) is
// SIGKILLed and restarted every few seconds. At quiescence every job was
// served exactly once or given up on with a reason, no slot is held, no VM
// is alive, and `berth replay --check` finds no difference on any dispatcher
// or watchdog.
//
// Size: BERTH_CHAOS_JOBS (default 150, the size `make test` runs; `make
// chaos` runs 2000). -short skips it unless the size is set. Seed: BERTH_CHAOS_SEED (default: the clock; it is
// printed, so a failing run can be replayed with the same choices).
package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"errors"
	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/tests/ghsim"
	"github.com/berth-ci/berth/tests/procs"
)

func TestMain(m *testing.M) { os.Exit(procs.Main(m)) }

func envInt(t *testing.T, name string, def uint64) uint64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: want a non-negative integer", name, v)
	}
	return n
}

func TestChaos(t *testing.T) {
	// What it found, each fixed and tested on its own: a VM stopped mid-job
	// on a late in_progress webhook (the dispatcher now asks GitHub before
	// releasing an idle runner); VMs stranded on a host no teardown reached
	// (a clustered stream answers a duplicate booking as stored, and the
	// replica folded its own version with another host); running jobs torn
	// down when NATS churn silenced every heartbeat (a lost host now keeps
	// the slots of jobs that run).
	if testing.Short() && os.Getenv("BERTH_CHAOS_JOBS") == "" {
		t.Skip("runs real processes on a 3-node cluster for about a minute")
	}
	t.Parallel() // mostly waiting: it shares the machine with the other test here
	jobs := int(envInt(t, "BERTH_CHAOS_JOBS", 150))
	seed := envInt(t, "BERTH_CHAOS_SEED", uint64(time.Now().UnixNano()))
	fmt.Fprintf(os.Stderr, "chaos: %d jobs, seed %d (rerun with BERTH_CHAOS_SEED=%d)\n", jobs, seed, seed)
	t.Logf("chaos: %d jobs, seed %d", jobs, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x5bd1e995))

	sys := procs.Start(t, procs.Options{NATSNodes: 3, Dispatchers: 2, Watchdogs: 2, Tune: func(c *config.Config) {
		// A provisioning budget for a loaded machine under chaos. A late
		// in_progress webhook no longer matters: at the deadline the
		// dispatcher asks GitHub to delete the runner, which it refuses
		// while the runner runs a job.
		c.Watchdog.RegistrationTimeout, c.Watchdog.ProvisionTimeout = 20*time.Second, 20*time.Second
		for i := range c.Agents {
			a := &c.Agents[i]
			a.Pools["linux"] = config.Pool{Labels: a.Pools["linux"].Labels, Slots: 6}
			a.PhysicalCap = 8
		}
	}})

	// Jobs arrive at about 4 a second, for as long as that takes.
	arrival := time.Duration(jobs) * 250 * time.Millisecond
	plan := workload(rng, jobs)
	start := time.Now()
	// Each NATS leader loss stalls appends for up to ~10 s (raft election),
	// so the fleet serves at about half the arrival rate under chaos.
	deadline := start.Add(3*arrival + 3*time.Minute)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	enqueued := make(chan struct{})
	go func() {
		defer close(enqueued)
		gap := arrival / time.Duration(max(jobs, 1))
		for i, spec := range plan {
			if ctx.Err() != nil {
				return
			}
			sys.Sim.Enqueue(spec)
			time.Sleep(time.Until(start.Add(time.Duration(i+1) * gap))) // the arrival schedule under test, not a wait for an outcome
		}
	}()

	// A victim is a random part: first its kind, then which one.
	victims := [][]*procs.Proc{sys.Dispatchers, sys.Watchdogs, sys.Agents, sys.NATS.Nodes}
	kills := map[string]int{}
	total := 0
	lastPrint := time.Time{}
	next := time.Now().Add(time.Second + time.Duration(rng.Int64N(int64(2*time.Second))))
	progress := func() {
		_, _, line := sys.Progress()
		fmt.Fprintf(os.Stderr, "chaos [%s]: %s; kills %d %v\n", time.Since(start).Round(time.Second), line, total, kills)
	}
	for {
		done, n, _ := sys.Progress()
		arrived := false
		select {
		case <-enqueued:
			arrived = true
		default:
		}
		if arrived && done == n {
			break // every job completed: stop the chaos and let the fleet settle
		}
		if time.Now().After(deadline) {
			progress()
			t.Fatalf("jobs still open after %s of chaos", time.Since(start).Round(time.Second))
		}
		if time.Since(lastPrint) >= 3*time.Second {
			lastPrint = time.Now()
			progress()
		}
		if time.Now().Before(next) {
			time.Sleep(100 * time.Millisecond) // the chaos schedule's pace: the next kill is due at next
			continue
		}
		kind := victims[rng.IntN(len(victims))]
		v := kind[rng.IntN(len(kind))]
		down := 200*time.Millisecond + time.Duration(rng.Int64N(int64(1300*time.Millisecond)))
		v.Kill(t)
		kills[v.Name]++
		total++
		time.Sleep(down) // the victim stays down this long: the fault under test
		v.Restart(t)
		if isNATS(sys, v) {
			awaitReplicasCurrent(t, sys, 60*time.Second)
		} else {
			sys.AwaitServing(v, 30*time.Second)
		}
		next = time.Now().Add(2*time.Second + time.Duration(rng.Int64N(int64(2*time.Second))))
	}
	progress()
	fmt.Fprintf(os.Stderr, "chaos: every job completed after %s and %d kills; waiting for the fleet to settle\n",
		time.Since(start).Round(time.Second), total)
	sys.AwaitQuiet(2*time.Minute, progress)
	sys.Verify()
	t.Logf("chaos: %d jobs, %d kills %v, %s", jobs, total, kills, time.Since(start).Round(time.Second))
}

// workload: mostly linux jobs, a quarter macos, 200 ms to 1 s each.
func workload(rng *rand.Rand, n int) []ghsim.JobSpec {
	linux := [][]string{{"self-hosted", "linux"}, {"self-hosted", "linux", "x64"}}
	macos := []string{"self-hosted", "macos", "arm64"}
	out := make([]ghsim.JobSpec, n)
	for i := range out {
		labels := linux[rng.IntN(len(linux))]
		if rng.IntN(4) == 0 {
			labels = macos
		}
		conclusion := ghsim.ConclusionSuccess
		if rng.IntN(10) == 0 {
			conclusion = ghsim.ConclusionFailure
		}
		out[i] = ghsim.JobSpec{Labels: labels, Duration: time.Duration(200+rng.IntN(800)) * time.Millisecond, Conclusion: conclusion}
	}
	return out
}

func isNATS(sys *procs.System, p *procs.Proc) bool {
	for _, n := range sys.NATS.Nodes {
		if n == p {
			return true
		}
	}
	return false
}

// awaitReplicasCurrent waits until the stream's leader and every replica
// are current again after a node restart, so that the next kill never
// takes a second replica of the log away (3 replicas survive one loss).
func awaitReplicasCurrent(t *testing.T, sys *procs.System, within time.Duration) {
	t.Helper()
	testkit.Poll(t, context.Background(), within, 200*time.Millisecond, "stream leader and replicas current", func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		s, err := sys.JetStream().Stream(ctx, events.StreamName)
		if err != nil {
			return err
		}
		info, err := s.Info(ctx)
		switch {
		case err != nil:
			return err
		case info.Cluster == nil || info.Cluster.Leader == "":
			return errors.New("no leader")
		}
		ok := len(info.Cluster.Replicas) == 2
		for _, r := range info.Cluster.Replicas {
			ok = ok && r.Current && !r.Offline
		}
		if !ok {
			return fmt.Errorf("leader %s, replicas %+v", info.Cluster.Leader, info.Cluster.Replicas)
		}
		return nil
	})
}
