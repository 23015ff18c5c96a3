package vz

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// NewHypervisor makes the hypervisor a helper boots its guest on, giving
// it cpus CPUs and memoryBytes of memory (NewPlatformHypervisor in berth).
type NewHypervisor func(cpus uint, memoryBytes uint64) (Hypervisor, error)

// Serve is the helper process's side (`berth vz-guest`): it reads requests
// from in, runs them on one guest of a hypervisor made by newHV at boot,
// and writes replies to out. Requests are served concurrently (a wedged
// stop does not hold a State). It returns after answering a drop (the
// guest's objects are freed; the process should then exit), or when in
// ends: the agent is gone, so the guest is forced off (for at most a
// second) and the process exits, taking the guest with it.
func Serve(ctx context.Context, in io.Reader, out io.Writer, newHV NewHypervisor) error {
	s := &server{newHV: newHV, out: out}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dropped := make(chan error, 1)
	reqs := make(chan request)
	readErr := make(chan error, 1)
	go func() {
		for {
			var r request
			if err := readFrame(in, &r); err != nil {
				readErr <- err
				return
			}
			select {
			case reqs <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case err := <-dropped:
			return err
		case err := <-readErr:
			s.abandon()
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case r := <-reqs:
			if r.Op == opDrop {
				// Answered in order: no other reply may follow it.
				err := s.drop(ctx)
				werr := s.reply(r.ID, StateAbsent, err)
				dropped <- errors.Join(err, werr)
				continue
			}
			// Not waited for: a call that wedges must not keep the helper
			// from exiting after a drop (its exit ends the guest).
			go func() {
				st, err := s.do(ctx, r)
				_ = s.reply(r.ID, st, err)
			}()
		}
	}
}

// server holds the helper's one guest.
type server struct {
	newHV NewHypervisor
	out   io.Writer
	wmu   sync.Mutex // one frame at a time on out

	mu      sync.Mutex
	hv      Hypervisor
	attempt string
}

func (s *server) reply(id uint64, st State, err error) error {
	r := reply{ID: id, State: st}
	if err != nil {
		r.Error = err.Error()
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return writeFrame(s.out, r)
}

func (s *server) guest() (Hypervisor, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hv, s.attempt
}

func (s *server) do(ctx context.Context, r request) (State, error) {
	if r.Op == opBoot {
		return StateAbsent, s.boot(ctx, r)
	}
	hv, attempt := s.guest()
	if hv == nil { // nothing booted: absent, and nothing to stop
		return StateAbsent, nil
	}
	switch r.Op {
	case opState:
		return hv.State(ctx, attempt)
	case opDetachNetwork:
		return StateAbsent, hv.DetachNetwork(ctx, attempt)
	case opRequestStop:
		return StateAbsent, hv.RequestStop(ctx, attempt)
	case opForceStop:
		return StateAbsent, hv.ForceStop(ctx, attempt)
	}
	return StateAbsent, fmt.Errorf("vz helper: unknown operation %q (an agent of another berth version?)", r.Op)
}

func (s *server) boot(ctx context.Context, r request) error {
	if r.Guest == nil {
		return errors.New("vz helper: boot without a guest")
	}
	s.mu.Lock()
	if s.hv != nil {
		s.mu.Unlock()
		return fmt.Errorf("vz helper: already holds %s; one guest per helper", s.attempt)
	}
	hv, err := s.newHV(r.CPUs, r.Memory)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	s.hv, s.attempt = hv, r.Guest.Attempt
	s.mu.Unlock()
	return hv.Boot(ctx, *r.Guest)
}

func (s *server) drop(ctx context.Context) error {
	hv, attempt := s.guest()
	if hv == nil {
		return nil
	}
	return hv.Drop(ctx, attempt)
}

// abandon turns the guest off when the agent is gone; the process exit
// that follows ends it anyway, so this is only a courtesy to the guest.
func (s *server) abandon() {
	hv, attempt := s.guest()
	if hv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { _ = hv.ForceStop(ctx, attempt); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}
