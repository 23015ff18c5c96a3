package crash

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/crashpoint"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/tests/ghsim"
	"github.com/berth-ci/berth/tests/procs"
)

// Given a warm pool (linux, min_idle 3) being filled, when the dispatcher is
// SIGKILLed right after its second warm booking and restarted, then the
// restarted dispatcher rebuilds from the log and ends with exactly 3 idle
// warm VMs (no booking lost, none doubled: each warm id booked once), and a
// job that arrives then runs on one of them, after which the pool is back
// at 3 (issue 8: replay is the truth for warm pools too).
func TestARestartMidRefillEndsWithExactlyTheWarmTarget(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the services as processes")
	}
	t.Parallel()
	const target = 3
	sys := procs.Start(t, procs.Options{
		Env: map[string][]string{"dispatcher-0": {fmt.Sprintf("%s=%s@2", crashpoint.Env, crashpoint.DispatcherAfterReserve)}},
		Tune: func(c *config.Config) {
			c.Dispatcher.WarmPools = map[string]config.WarmPool{"linux": {MinIdle: target}}
		},
	})
	p := sys.Proc("dispatcher-0")
	if st := p.AwaitExit(t, 60*time.Second); !procs.KilledBySIGKILL(st) {
		t.Fatalf("dispatcher exited %v, not by SIGKILL after its second booking", st)
	}
	p.Restart(t)
	sys.AwaitServing(p, 30*time.Second)

	base := sys.DispatcherURLs[0]
	idle := func(within time.Duration) events.PoolStatus {
		t.Helper()
		var last events.PoolStatus
		stable := 0
		testkit.Poll(t, context.Background(), within, 200*time.Millisecond, fmt.Sprintf("linux settled at %d idle warm VMs", target), func(context.Context) error {
			st, err := sys.Status(base)
			if err != nil {
				stable = 0
				return err
			}
			for _, pl := range st.Pools {
				if pl.Name == "linux" {
					last = pl
				}
			}
			if last.WarmIdle == target && last.WarmWarming == 0 && last.Held == target {
				stable++ // held steady for 10 polls (2 s): no booking in flight
			} else {
				stable = 0
			}
			if stable < 10 {
				return fmt.Errorf("%d steady polls of 10: %+v", stable, last)
			}
			return nil
		})
		return last
	}
	idle(60 * time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fleet, err := eventlog.Replay(ctx, sys.JetStream(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var booked []string
	for id, a := range fleet.Attempts {
		if a.Warm {
			booked = append(booked, id)
		}
	}
	if vs := fleet.Check(); len(vs) > 0 {
		t.Fatalf("invariants broken after the restart: %v", vs)
	}
	if n := fleet.Pools["linux"].WarmMinted; n != target {
		t.Errorf("%d warm VMs booked in all, want exactly %d: the restart booked again what was booked (%v)", n, target, booked)
	}

	job := sys.Sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted", "linux"}, Duration: 200 * time.Millisecond})
	testkit.Poll(t, context.Background(), 60*time.Second, 100*time.Millisecond, "the job completed", func(context.Context) error {
		var jv ghsim.JobView
		for _, j := range sys.Sim.Jobs() {
			if j.ID == job {
				jv = j
			}
		}
		if jv.Status != ghsim.StatusCompleted {
			return fmt.Errorf("the job is %s", jv.Status)
		}
		if !strings.HasPrefix(jv.RunnerName, "berth-warm-linux-") {
			t.Fatalf("the job ran on %q, want a warm VM", jv.RunnerName)
		}
		return nil
	})
	idle(60 * time.Second)
}
