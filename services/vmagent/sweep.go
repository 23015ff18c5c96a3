package vmagent

import (
	"context"
	"errors"
	"path/filepath"
	"sort"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/vmagent/backend"
)

// sweep is the orphan sweep's state, owned by the loop.
type sweep struct {
	next     time.Time            // when to read the inventory again
	reading  bool                 // a List call is in flight
	disabled bool                 // the backend has no inventory
	seen     map[string]time.Time // orphan attempt id → first seen
	stopping map[string]bool      // orphans being stopped
	last     []string             // the last inventory read
	swept    int                  // orphans stopped since start
}

// inventory reads the backend's real inventory off the loop, at start and
// every InventoryEvery, and hands it to reconcile.
func (a *Agent) inventory(ctx context.Context, now time.Time) {
	s := &a.sweep
	if s.disabled || s.reading || now.Before(s.next) {
		return
	}
	every := a.opts.InventoryEvery
	if every <= 0 {
		every = time.Minute
	}
	s.reading, s.next = true, now.Add(every)
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		var ids []string
		err := a.step(ctx, a.opts.StopTimeout, func(c context.Context) error {
			var err error
			ids, err = a.backend.List(c)
			return err
		})
		a.Loop.Post(ctx, func() {
			s.reading = false
			a.reconcile(ctx, time.Now(), ids, err)
		})
	}()
}

// reconcile stops VMs that no live attempt owns once they have been seen for
// OrphanGrace. A failed read stops nothing (law 7: a negative or failed read
// is not a fact), and only VMs named like Berth's attempts are touched.
func (a *Agent) reconcile(ctx context.Context, now time.Time, ids []string, err error) {
	s := &a.sweep
	switch {
	case errors.Is(err, backend.ErrNoInventory):
		s.disabled = true
		a.opts.Logger.Info("backend has no inventory: no orphan sweep")
		return
	case err != nil:
		a.opts.Logger.Warn("inventory read failed; nothing is stopped on a failed read", "err", err)
		return
	}
	if s.seen == nil {
		s.seen, s.stopping = map[string]time.Time{}, map[string]bool{}
	}
	sort.Strings(ids)
	s.last = ids
	grace := a.opts.OrphanGrace
	if grace <= 0 {
		grace = 2 * time.Minute
	}
	listed := map[string]bool{}
	for _, id := range ids {
		listed[id] = true
		if !events.IsAttemptID(id) || a.owns(id) {
			delete(s.seen, id)
			continue
		}
		first, ok := s.seen[id]
		if !ok {
			s.seen[id] = now
			a.opts.Logger.Warn("VM no live attempt owns; it will be stopped after the grace period", "attempt", id, "grace", grace)
			continue
		}
		if now.Sub(first) >= grace && !s.stopping[id] {
			a.stopOrphan(ctx, id)
		}
	}
	for id := range s.seen {
		if !listed[id] {
			delete(s.seen, id)
		}
	}
}

// owns reports whether a live attempt of this host accounts for the VM.
func (a *Agent) owns(id string) bool {
	if a.creating[id] || a.stopping[id] {
		return true
	}
	at := a.Fold.Attempts[id]
	return at != nil && at.Host == a.opts.Host && !at.Stopped && (at.Placed || at.Provisioning)
}

func (a *Agent) stopOrphan(ctx context.Context, id string) {
	s := &a.sweep
	s.stopping[id] = true
	vm := backend.VM{Attempt: id, Host: a.opts.Host}
	if !a.inMemoryJIT() {
		vm.WorkDir = filepath.Join(a.opts.DataDir, "attempts", id)
		vm.JITConfigFile = filepath.Join(vm.WorkDir, "jitconfig")
	}
	logger := a.opts.Logger.With("attempt", id)
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		err := a.step(ctx, a.opts.StopTimeout, func(c context.Context) error { return a.backend.Stop(c, vm) })
		a.Loop.Post(ctx, func() {
			delete(s.stopping, id)
			if err != nil {
				logger.Warn("orphan stop failed; the next sweep tries again", "err", err)
				return
			}
			delete(s.seen, id)
			s.swept++
			logger.Warn("orphan VM stopped")
		})
	}()
}
