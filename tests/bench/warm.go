package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/tests/ghsim"
)

// WarmOptions size the time-to-runner phase (issue 8).
type WarmOptions struct {
	Jobs, Hosts, Warm int
	Rate              float64       // jobs/s offered
	Boot              time.Duration // every VM's boot time
}

// TimeToRunner runs linux jobs on a fleet whose linux pool keeps Warm warm
// VMs and whose VMs take Boot to boot, and reports job queued → runner
// started, split by warm hits (a VM booted before the job, handed its JIT
// config) and cold starts (a VM booked and booted for the job), both read
// from the log.
func TimeToRunner(ctx context.Context, e Env, o WarmOptions) (Result, error) {
	res := Result{Phase: "time to runner"}
	e.say("time to runner: %d linux jobs at %.0f jobs/s on %d hosts, %d warm VMs, boot %s", o.Jobs, o.Rate, o.Hosts, o.Warm, o.Boot)
	f, err := e.fleet(ctx, FleetOptions{Hosts: o.Hosts, LinuxSlots: 8, Warm: o.Warm, Boot: o.Boot})
	if err != nil {
		return res, err
	}
	defer f.Close()
	// Let the pool fill before the first job.
	deadline := time.Now().Add(o.Boot + 30*time.Second)
	for {
		var idle int
		_ = f.Snapshot(ctx, func(fl *events.Fleet) {
			for _, a := range fl.Attempts {
				if a.Idle() {
					idle++
				}
			}
		})
		if idle >= o.Warm {
			break
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("the warm pool did not fill: %d of %d idle after %s", idle, o.Warm, o.Boot+30*time.Second)
		}
		time.Sleep(50 * time.Millisecond)
	}
	specs := make([]ghsim.JobSpec, o.Jobs)
	for i := range specs {
		specs[i] = ghsim.JobSpec{Labels: LinuxLabels, Duration: 200 * time.Millisecond}
	}
	if _, err := e.drive(ctx, "time to runner", f, specs, feed{rate: o.Rate}, settled(o.Jobs)); err != nil {
		return res, err
	}
	fl, err := eventlog.Replay(ctx, f.JS, nil)
	if err != nil {
		return res, err
	}
	var warm, cold []time.Duration
	for _, j := range fl.Jobs {
		a := fl.Attempts[j.Runner]
		if a == nil || !a.RunnerStarted || j.QueuedAt.IsZero() {
			continue
		}
		d := a.RunnerStartedAt.Sub(j.QueuedAt)
		if strings.HasPrefix(a.ID, "berth-warm-") {
			warm = append(warm, d)
		} else {
			cold = append(cold, d)
		}
	}
	w, c := Summarize(warm), Summarize(cold)
	res.Rows = append(res.Rows,
		Row{Figure: fmt.Sprintf("Time to runner, warm hit (queued → runner started), %d jobs", w.N), Value: pq(w),
			Reference: "cold start " + pq(c), Ratio: fmt.Sprintf("p50 %s", ratio(float64(w.P50), float64(c.P50))), Target: "— (issue 8)"},
		Row{Figure: fmt.Sprintf("Time to runner, cold start (VM booked and booted for the job, boot %s), %d jobs", o.Boot, c.N),
			Value: pq(c), Reference: "boot " + ms(o.Boot), Target: "— (issue 8)"})
	res.Notes = append(res.Notes, fmt.Sprintf("%d warm VMs kept in the linux pool; jobs offered at %.0f/s: the first ones and those arriving after a refill hit warm VMs, the rest start cold", o.Warm, o.Rate))
	return res, nil
}
