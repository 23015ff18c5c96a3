package crash

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/tests/ghsim"
	"github.com/berth-ci/berth/tests/procs"
)

// Given two dispatcher processes serving the linux pool through its runner
// scale set (the default lease, 6 s), when the one holding the set's
// message session is SIGKILLed mid-stream (its session left open on
// GitHub, its lease unrenewed, its cursor only in the log), then the other
// opens the session within 10 s (deleting the one GitHub still thinks
// alive), and every job is served exactly once: each job's queued,
// in-progress and completed facts are in the log once, none is lost or
// handled twice, and no slot, VM or runner is left.
func TestScaleSetSessionMovesToAnotherDispatcherWhenItsHolderIsKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the service processes (about a minute)")
	}
	sys := procs.Start(t, procs.Options{Dispatchers: 2, Tune: func(c *config.Config) {
		c.Dispatcher.GitHub.Intake = config.IntakeScaleSet
		c.Dispatcher.GitHub.ScaleSet.Pools = []string{"linux"}
	}})
	owner := func() string {
		for _, s := range sys.Sim.ScaleSets() {
			if s.Name == "linux" {
				return s.SessionOwner
			}
		}
		return ""
	}
	testkit.Eventually(t, 30*time.Second, "a dispatcher opens the linux set's session", func() bool { return owner() != "" })
	holder := owner()
	linux := []string{"self-hosted", "linux", "x64"}
	const jobs = 24
	enqueue := func(n int) {
		for range n {
			sys.Sim.Enqueue(ghsim.JobSpec{Labels: linux, Duration: 400 * time.Millisecond})
		}
	}
	// Twelve jobs on eight linux slots: when the third is done, the rest
	// are running or queued, so the kill lands mid-stream.
	enqueue(jobs / 2)
	testkit.Eventually(t, 30*time.Second, "the holder's first jobs are done", func() bool {
		done, _, _ := sys.Progress()
		return done >= 3
	})
	p := sys.Proc(holderProc(t, holder))
	p.Kill(t)
	killed := time.Now()
	t.Logf("SIGKILLed %s, which held the session", holder)
	enqueue(jobs / 2) // demand goes on arriving while nobody holds the session
	testkit.Eventually(t, 10*time.Second, "another dispatcher takes the session over", func() bool {
		o := owner()
		return o != "" && o != holder
	})
	t.Logf("%s took the session over %v after the kill", owner(), time.Since(killed).Round(time.Millisecond))
	p.Restart(t) // so that replay --check asks both dispatchers
	sys.AwaitServing(p, 30*time.Second)
	sys.AwaitQuiet(90*time.Second, func() {
		_, _, line := sys.Progress()
		t.Log(line)
	})
	sys.Verify()
	verifyOneFactEach(t, sys, jobs)
}

// holderProc maps a session owner ("dispatcher-N", N from 1, as run names
// it from the instance) to its process name ("dispatcher-(N-1)").
func holderProc(t *testing.T, owner string) string {
	var n int
	if _, err := fmt.Sscanf(owner, "dispatcher-%d", &n); err != nil || n < 1 {
		t.Fatalf("session owner %q is not a dispatcher instance", owner)
	}
	return "dispatcher-" + strconv.Itoa(n-1)
}

// verifyOneFactEach checks that each job's queued, in-progress and
// completed facts are each stored exactly once.
func verifyOneFactEach(t *testing.T, sys *procs.System, jobs int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	count := map[int64]map[string][]string{}
	_, err := eventlog.Scan(ctx, sys.JetStream(), "berth.evt.job.>", 0, 0, func(d eventlog.Delivered) error {
		if d.Err != nil {
			return d.Err
		}
		var id int64
		switch p := d.Event.Data.(type) {
		case *events.JobQueued:
			id = p.JobID
		case *events.JobInProgress:
			id = p.JobID
		case *events.JobCompleted:
			id = p.JobID
		default:
			return nil
		}
		if count[id] == nil {
			count[id] = map[string][]string{}
		}
		count[id][d.Event.Type()] = append(count[id][d.Event.Type()], fmt.Sprintf("%s by %s at seq %d", d.Event.ID, d.Event.Source, d.Event.Seq))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(count) != jobs {
		t.Errorf("the log has facts of %d jobs, want %d", len(count), jobs)
	}
	for id, byType := range count {
		for _, typ := range []string{events.TypeJobQueued, events.TypeJobInProgress, events.TypeJobCompleted} {
			if len(byType[typ]) != 1 {
				t.Errorf("job %d: %d %s facts (%v), want exactly 1", id, len(byType[typ]), typ, byType[typ])
			}
		}
	}
}
