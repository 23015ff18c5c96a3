package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-ci/berth/services/cli"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/tests/ghsim"
	"github.com/berth-ci/berth/tests/harness"
)

// scaleSetOptions is the demo fleet with the linux pool served through a
// runner scale set (the real actions/scaleset client against the
// simulator) and macos through webhooks; the REST reconcile poll runs
// often, since messages are lost on purpose.
func scaleSetOptions(t *testing.T, jobs int) harness.Options {
	o := demoOptions(t, jobs)
	o.SimTune = func(c *ghsim.Config) {
		c.AcquireTimeout = time.Second
		c.ReofferAfter = 2 * time.Second
	}
	o.Tune = func(c *config.Config) {
		gh := &c.Dispatcher.GitHub
		gh.Intake = config.IntakeScaleSet
		gh.ScaleSet.Pools = []string{"linux"}
		gh.ScaleSet.LeaseTTL = 2 * time.Second
		c.Dispatcher.ReconcileAfter = 2 * time.Second
		c.Dispatcher.ReconcileEvery = time.Second
		c.Dispatcher.ReconcileLimit = 30
	}
	return o
}

// faults makes the simulator lose, duplicate, empty and delay messages at
// random (seeded) and evict the sessions every few seconds until stop.
func faults(sim *ghsim.Sim, seed uint64, evictEvery time.Duration) (stop func()) {
	r := rand.New(rand.NewPCG(seed, seed+1))
	var mu sync.Mutex
	sim.MessageFaults(func(ghsim.MessageView) (ghsim.MessageFault, time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		switch x := r.Float64(); {
		case x < 0.08:
			return ghsim.Drop, 0
		case x < 0.16:
			return ghsim.Duplicate, 0
		case x < 0.24:
			return ghsim.Empty, 0
		case x < 0.30:
			return ghsim.Delay, 150 * time.Millisecond
		}
		return ghsim.Deliver, 0
	})
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(evictEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				sim.EvictSessions()
			}
		}
	})
	return func() { close(done); wg.Wait(); sim.MessageFaults(nil) }
}

// Given the linux pool served through its runner scale set and macos
// through webhooks, when jobs run while the simulator drops, duplicates,
// empties and delays messages and evicts the session every few seconds,
// then every job is served exactly once on one of Berth's runners, no slot
// is held, no VM is alive, and a replay equals the live projection.
func TestScaleSetIntakeServesEveryJobOnceThroughFaults(t *testing.T) {
	jobs := 200
	if n, err := strconv.Atoi(os.Getenv("BERTH_SCALESET_JOBS")); err == nil && n > 0 && !raceEnabled {
		jobs = n // BERTH_SCALESET_JOBS=1000 without -race: the 1,000-job run (make test runs it)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	o := scaleSetOptions(t, jobs)
	o.Timeout = 3 * time.Minute
	if os.Getenv("BERTH_SCALESET_LOG") != "" { // the services' info log, to see why a run stalls
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	f, err := harness.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	stop := faults(f.Sim, 11, 3*time.Second)
	rep, err := f.Drive(ctx, o)
	stop()
	if err != nil {
		f.Stop()
		t.Fatal(err)
	}
	sets := f.Sim.ScaleSets()
	if err := f.Stop(); err != nil {
		t.Errorf("shutdown: %v", err)
	}
	if !rep.OK() {
		t.Errorf("served %d of %d (%d not: %d queued, %d running), %d slots held, %d VMs alive, replay equal %v %s, violations %v",
			rep.Served, rep.Jobs, rep.Failed, rep.Queued, rep.Running, rep.SlotsHeld, rep.VMsAlive, rep.ReplayEqual, rep.ReplayDiff, rep.Violations)
	}
	for _, s := range sets {
		t.Logf("scale set %s: capacity %d, polls %d, delivered %d, statistics %v", s.Name, s.Capacity, s.Polls, s.Delivered, s.Stats)
	}
	if len(sets) != 1 || sets[0].Name != "linux" || sets[0].Delivered == 0 {
		t.Errorf("scale sets %+v: want one, linux, that delivered messages", sets)
	}
}

// linuxSet is the simulator's view of the linux pool's scale set.
func linuxSet(sim *ghsim.Sim) (ghsim.ScaleSetView, bool) {
	for _, s := range sim.ScaleSets() {
		if s.Name == "linux" {
			return s, true
		}
	}
	return ghsim.ScaleSetView{}, false
}

// Given the linux pool (4 slots on each of two hosts) served through its
// scale set, when host-a is cordoned the next poll advertises 4 fewer; and
// when 16 long jobs arrive, GitHub (the simulator) never has more of them
// assigned than the 8 slots: the rest wait, acquired, until slots free up;
// all 16 are served once.
func TestScaleSetCapacityBoundsAssignment(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	o := scaleSetOptions(t, 0)
	f, err := harness.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Stop()
	capacity := func(want int) func() bool {
		return func() bool { s, ok := linuxSet(f.Sim); return ok && s.Capacity == want && s.SessionID != "" }
	}
	testkit.Eventually(t, 20*time.Second, "an idle fleet advertises its 8 linux slots", capacity(8))
	nc, js, err := eventlog.Connect(f.Sys.NATSURL, "test-cordon")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := cli.HostAction(ctx, js, "cordon", "host-a", "capacity test"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "cordoning host-a lowers the capacity to 4", capacity(4))
	if _, err := cli.HostAction(ctx, js, "uncordon", "host-a", "capacity test"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "uncordoning host-a raises it to 8", capacity(8))

	for range 16 {
		f.Sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted", "linux", "x64"}, Duration: 2 * time.Second})
	}
	heldBack := false
	testkit.Eventually(t, 90*time.Second, "16 jobs served", func() bool {
		s, _ := linuxSet(f.Sim)
		if s.Stats["totalAssignedJobs"] > 8 {
			var jobs []string
			for _, j := range f.Sim.Jobs() {
				jobs = append(jobs, fmt.Sprintf("%d %s %s", j.ID, j.Status, j.RunnerName))
			}
			t.Fatalf("GitHub assigned %d jobs to a set with 8 slots (capacity %d; statistics %v); the jobs then: %s",
				s.Stats["totalAssignedJobs"], s.Capacity, s.Stats, strings.Join(jobs, "; "))
		}
		heldBack = heldBack || (s.Stats["totalAssignedJobs"] == 8 && s.Stats["totalAcquiredJobs"] > 0)
		return allDone(f.Sim.Jobs(), 16)
	})
	if !heldBack {
		t.Error("never saw the full fleet hold jobs back (8 assigned, more acquired and waiting)")
	}
	for _, j := range f.Sim.Jobs() {
		if j.Completions != 1 || !strings.HasPrefix(j.RunnerName, "berth-") {
			t.Errorf("job %d: %d completions on %q; want 1 on a runner of ours", j.ID, j.Completions, j.RunnerName)
		}
	}
}

func allDone(jobs []ghsim.JobView, n int) bool {
	done := 0
	for _, j := range jobs {
		if j.Status == ghsim.StatusCompleted {
			done++
		}
	}
	return done == n
}
