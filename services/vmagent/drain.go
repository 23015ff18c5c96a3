package vmagent

import (
	"context"
	"time"

	"github.com/berth-ci/berth/events"
)

// drain takes the host out of service (DESIGN: SIGTERM on an agent): it
// appends "host draining" so nothing new is placed here, lets running jobs
// finish for up to ShutdownTimeout (a booting VM counts as active, and so
// does an abandoned one, until its late stop returns), then stops what is
// left, each stop bounded by StopTimeout, and waits for those stops: a
// stop that overruns abandons its VM, whose late stop is awaited for one
// more StopTimeout. Every count is derived from the fold (Active).
func (a *Agent) drain(ctx context.Context) {
	logger := a.opts.Logger
	at := a.opts.Now()
	ev := a.Log.New(at, events.HostDraining{HostChange: events.HostChange{Host: a.opts.Host, At: at, By: "vmagent",
		Reason: "agent received SIGTERM; running jobs may finish for up to " + a.opts.ShutdownTimeout.String()}})
	if _, err := a.Log.AppendConfirmed(ctx, ev, nil); err != nil {
		logger.Warn("could not announce the drain; stopping anyway", "err", err)
	}
	a.Loop.Post(ctx, func() { a.draining = true })
	deadline := time.Now().Add(a.opts.ShutdownTimeout)
	n, abandoned := a.active(ctx)
	logger.Info("draining", "active", n, "abandoned", abandoned, "timeout", a.opts.ShutdownTimeout)
	for last := time.Now(); n > 0 && time.Now().Before(deadline); n, abandoned = a.active(ctx) {
		if time.Since(last) > 10*time.Second {
			logger.Info("draining: waiting for running jobs and late stops", "active", n, "abandoned", abandoned,
				"left", time.Until(deadline).Round(time.Second))
			last = time.Now()
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n > 0 {
		logger.Warn("drain timeout: stopping the VMs still running", "active", n, "abandoned", abandoned)
		a.Loop.Post(ctx, func() { a.forceStop = true })
		// The stop, then its fact (stopped or abandoned) folded back: on a
		// loaded host that can take seconds, and leaving before it is stored
		// would lose what the host still runs. A VM whose stop overran
		// (abandoned) is awaited for its late stop one more StopTimeout.
		start := time.Now()
		end, late := start.Add(a.opts.StopTimeout+15*time.Second), start.Add(2*a.opts.StopTimeout)
		for ; n > 0 && time.Now().Before(end) && (n > abandoned || time.Now().Before(late)); n, abandoned = a.active(ctx) {
			time.Sleep(100 * time.Millisecond)
		}
	}
	logger.Info("drained", "left", n, "abandoned", abandoned)
}

// active counts, on the loop, this host's VMs that exist or are being
// created, and of those the abandoned ones (Active).
func (a *Agent) active(ctx context.Context) (n, abandoned int) {
	done := make(chan struct{})
	a.Loop.Post(ctx, func() {
		n, abandoned = Active(a.Fold, a.opts.Host, a.creating)
		close(done)
	})
	select {
	case <-done:
		return n, abandoned
	case <-ctx.Done():
		return 0, 0
	case <-time.After(5 * time.Second):
		return 1, 0 // the loop did not answer: unknown counts as still active (the caller's deadline ends the wait)
	}
}

// Active counts the host's VMs a drain waits for: those being created
// (creating) and those the fold says exist (provisioning, not stopped),
// abandoned ones included, and of those the abandoned ones: an abandoned
// VM may still run, and counts until a late stop is folded.
func Active(f *events.Fleet, host string, creating map[string]bool) (n, abandoned int) {
	n = len(creating)
	for at := range f.VMAttempts() {
		if at.Host != host || !at.VMLive() {
			continue
		}
		if at.Abandoned {
			abandoned++
		}
		if !creating[at.ID] {
			n++
		}
	}
	return n, abandoned
}
