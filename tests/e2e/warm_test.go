package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/run"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/tests/ghsim"
	"github.com/berth-ci/berth/tests/harness"
)

// poolStatus reads one pool from the dispatcher's live projection.
func poolStatus(ctx context.Context, sys *run.System, pool string) (events.PoolStatus, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+sys.DispatcherAddr+"/status", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return events.PoolStatus{}, err
	}
	defer resp.Body.Close()
	var st events.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return events.PoolStatus{}, err
	}
	for _, p := range st.Pools {
		if p.Name == pool {
			return p, nil
		}
	}
	return events.PoolStatus{}, fmt.Errorf("no pool %s in %+v", pool, st.Pools)
}

// waitUntil polls ok every 100 ms until it holds or ctx ends, failing with
// the last state ok described.
func waitUntil(t *testing.T, ctx context.Context, what string, ok func() (bool, string)) {
	t.Helper()
	deadline, _ := ctx.Deadline()
	testkit.Poll(t, ctx, time.Until(deadline), 100*time.Millisecond, what, func(context.Context) error {
		if done, state := ok(); !done {
			return fmt.Errorf("last: %s", state)
		}
		return nil
	})
}

// Given the whole system with a warm pool (linux, min_idle 2) on exec hosts
// whose sim-runner.sh has an assign step, when the pool has filled and a job
// arrives, then the job runs on a warm VM that was created before the job
// was queued (no create step in its path: the runner started through
// assign), and the pool refills to 2. Then a burst larger than the target
// (10 jobs for 8 slots) is served entirely, first on the warm VMs, the rest
// cold, within capacity: the log keeps its invariants.
func TestWarmPoolServesJobsWithoutACreateInTheirPath(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	o := demoOptions(t, 0)
	o.Tune = func(c *config.Config) {
		c.Dispatcher.WarmPools = map[string]config.WarmPool{"linux": {MinIdle: 2}}
	}
	f, err := harness.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Stop()
	idle := func(n int) func() (bool, string) {
		return func() (bool, string) {
			p, err := poolStatus(ctx, f.Sys, "linux")
			return err == nil && p.WarmIdle == n && p.WarmWarming == 0, fmt.Sprintf("%+v %v", p, err)
		}
	}
	waitUntil(t, ctx, "2 idle warm VMs", idle(2))

	linux := []string{"self-hosted", "linux"}
	job := f.Sim.Enqueue(ghsim.JobSpec{Labels: linux, Duration: 200 * time.Millisecond})
	done := func(ids ...int64) func() (bool, string) {
		return func() (bool, string) {
			open := 0
			for _, j := range f.Sim.Jobs() {
				for _, id := range ids {
					if j.ID == id && j.Status != ghsim.StatusCompleted {
						open++
					}
				}
			}
			return open == 0, fmt.Sprintf("%d of %d jobs open", open, len(ids))
		}
	}
	waitUntil(t, ctx, "the job completed", done(job))
	var jv ghsim.JobView
	for _, j := range f.Sim.Jobs() {
		if j.ID == job {
			jv = j
		}
	}
	if !strings.HasPrefix(jv.RunnerName, "berth-warm-linux-") {
		t.Fatalf("job ran on %q, want a warm VM", jv.RunnerName)
	}
	closeNC, js, err := run.JetStream(f.Sys.NATSURL)
	if err != nil {
		t.Fatal(err)
	}
	defer closeNC()
	fleet, err := eventlog.Replay(ctx, js, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := fleet.Attempts[jv.RunnerName]
	if a == nil || !a.Warm || !a.Assigned || !a.ProvisioningAt.Before(fleet.Jobs[job].QueuedAt) {
		t.Fatalf("attempt %+v: want a warm VM whose create began before job %d was queued (%v)", a, job, fleet.Jobs[job].QueuedAt)
	}
	waitUntil(t, ctx, "the pool refilled to 2 idle", idle(2))

	var burst []int64
	for range 10 {
		burst = append(burst, f.Sim.Enqueue(ghsim.JobSpec{Labels: linux, Duration: 300 * time.Millisecond}))
	}
	waitUntil(t, ctx, "the burst of 10 served", done(burst...))
	waitUntil(t, ctx, "the pool back at 2 idle", idle(2))
	fleet, err = eventlog.Replay(ctx, js, nil)
	if err != nil {
		t.Fatal(err)
	}
	if vs := fleet.Check(); len(vs) > 0 {
		t.Fatalf("invariants broken: %v", vs)
	}
	var warm, cold int
	for _, id := range burst {
		if r := fleet.Jobs[id].Runner; strings.HasPrefix(r, "berth-warm-") {
			warm++
		} else if r != "" {
			cold++
		}
	}
	if warm < 2 || warm+cold != len(burst) {
		t.Fatalf("burst ran %d on warm VMs and %d cold; want all %d served, at least 2 warm", warm, cold, len(burst))
	}
	t.Logf("burst: %d jobs on warm VMs, %d cold", warm, cold)
}
