package vmagent

import (
	"context"
	"sort"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/vmagent/backend"
	"github.com/berth-ci/berth/services/vmagent/runnerlog"
)

// DefaultRunnerPoll is how often an agent reads the output of its runners
// that took no job yet (Options.RunnerPoll).
const DefaultRunnerPoll = 5 * time.Second

// runnerWatch is the runner watch's state, owned by the loop.
type runnerWatch struct {
	next    time.Time // when to read again
	reading bool      // a read is in flight
}

// watched reports whether the agent still reads the attempt's runner
// output: its runner started, took no job, is not known refused, and its VM
// is not on its way out. A runner that took a job is GitHub's business.
func watched(at *events.Attempt) bool {
	return at.RunnerStarted && at.BoundJobID == 0 && !at.RunnerRefused && !at.TeardownReq && !at.Stopped && !at.Abandoned
}

// watchRunners reads, off the loop and every RunnerPoll, what this host's
// watched runners printed (backend.RunnerOutput; a backend that cannot
// show it is not read), and appends the facts it calls for
// (RunnerReports).
func (a *Agent) watchRunners(ctx context.Context, now time.Time) {
	ro, ok := backend.As[backend.RunnerOutput](a.backend)
	w := &a.runners
	if !ok || w.reading || now.Before(w.next) {
		return
	}
	every := a.opts.RunnerPoll
	if every <= 0 {
		every = DefaultRunnerPoll
	}
	var vms []backend.VM
	for at := range a.Fold.VMAttempts() {
		if at.Host == a.opts.Host && watched(at) {
			vms = append(vms, a.vm(at))
		}
	}
	w.next = now.Add(every)
	if len(vms) == 0 {
		return
	}
	w.reading = true
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		seen := map[string]runnerlog.Status{}
		for _, vm := range vms {
			var out []byte
			err := a.step(ctx, every, func(c context.Context) (err error) { out, err = ro.RunnerOutput(c, vm); return err })
			if err != nil {
				a.opts.Logger.Debug("runner output unreadable; read again later", "attempt", vm.Attempt, "err", err)
				continue
			}
			seen[vm.Attempt] = runnerlog.Read(out)
		}
		a.Loop.Post(ctx, func() {
			w.reading = false
			for _, p := range RunnerReports(a.Fold, a.opts.Host, a.opts.Pools, seen, a.InFlight) {
				if r, ok := p.(events.AttemptRunnerRefused); ok {
					a.opts.Logger.Warn("GitHub refused this runner's version: the image is marked degraded and its job waits for a runner of a current image",
						"attempt", r.Attempt, "pool", r.Pool, "image", r.Image, "version", r.Version, "github", r.Message)
				}
				_ = a.Append(ctx, p)
			}
		})
	}()
}

// RunnerReports is what the runner outputs seen (attempt → what it
// printed) call for on this host, in attempt order: each attempt's
// version once (AttemptRunnerVersion), and GitHub's refusal of it once
// (AttemptRunnerRefused), naming the image its pool boots (events.ImageOf).
// A fact the fold holds, or that this agent appended and the fold has not
// shown yet (inFlight), is not repeated. It is pure.
func RunnerReports(f *events.Fleet, host string, pools map[string]events.PoolSlots, seen map[string]runnerlog.Status,
	inFlight func(eventID string) bool) []events.Payload {
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var out []events.Payload
	fresh := func(p events.Payload) bool { return inFlight == nil || !inFlight(p.EventID()) }
	for _, id := range ids {
		at, s := f.Attempts[id], seen[id]
		if at == nil || at.Host != host || !watched(at) {
			continue
		}
		r := events.AttemptRef{Attempt: at.ID, Pool: at.Pool, Host: at.Host}
		image := events.ImageOf(at.Pool, pools[at.Pool].Shape)
		if v := (events.AttemptRunnerVersion{AttemptRef: r, Image: image, Version: s.Version}); s.Version != "" && at.RunnerVersion == "" && fresh(v) {
			out = append(out, v)
		}
		if s.Refused {
			refused := events.AttemptRunnerRefused{AttemptRef: r, Image: image, Version: s.Version, Minimum: s.Minimum, Message: s.Message}
			if fresh(refused) {
				out = append(out, refused)
			}
		}
	}
	return out
}
