package vmagent

import (
	"context"
	"time"

	"github.com/berth-ci/berth/events"
)

// drain takes the host out of service (DESIGN: SIGTERM on an agent): it
// appends "host draining" so nothing new is placed here, lets running jobs
// finish for up to ShutdownTimeout (a booting VM counts as active), then
// stops what is left, each stop bounded by StopTimeout.
func (a *Agent) drain(ctx context.Context) {
	logger := a.opts.Logger
	at := a.opts.Now()
	ev := a.Log.New(at, events.HostDraining{HostChange: events.HostChange{Host: a.opts.Host, At: at, By: "vmagent",
		Reason: "agent received SIGTERM; running jobs may finish for up to " + a.opts.ShutdownTimeout.String()}})
	if _, _, err := a.Log.Append(ctx, ev, nil); err != nil {
		logger.Warn("could not announce the drain; stopping anyway", "err", err)
	}
	a.Loop.Post(ctx, func() { a.draining = true })
	deadline := time.Now().Add(a.opts.ShutdownTimeout)
	logger.Info("draining", "active", a.active(ctx), "timeout", a.opts.ShutdownTimeout)
	for last := time.Now(); a.active(ctx) > 0 && time.Now().Before(deadline); {
		if time.Since(last) > 10*time.Second {
			logger.Info("draining: waiting for running jobs", "active", a.active(ctx), "left", time.Until(deadline).Round(time.Second))
			last = time.Now()
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := a.active(ctx); n > 0 {
		logger.Warn("drain timeout: stopping the VMs still running", "active", n)
		a.Loop.Post(ctx, func() { a.forceStop = true })
		// The stop, then its fact (stopped or abandoned) folded back: on a
		// loaded host that can take seconds, and leaving before it is stored
		// would lose what the host still runs.
		end := time.Now().Add(a.opts.StopTimeout + 15*time.Second)
		for a.active(ctx) > 0 && time.Now().Before(end) {
			time.Sleep(100 * time.Millisecond)
		}
	}
	logger.Info("drained", "left", a.active(ctx))
}

// active counts this host's VMs that exist or are being created, read on
// the loop.
func (a *Agent) active(ctx context.Context) int {
	n := 0
	done := make(chan struct{})
	a.Loop.Post(ctx, func() {
		n = len(a.creating)
		for at := range a.Fold.VMAttempts() {
			if at.Host == a.opts.Host && at.VMLive() && !at.Abandoned && !a.creating[at.ID] {
				n++
			}
		}
		close(done)
	})
	select {
	case <-done:
		return n
	case <-ctx.Done():
		return 0
	case <-time.After(5 * time.Second):
		return 1 // the loop did not answer: unknown counts as still active (the caller's deadline ends the wait)
	}
}
