package vz

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sort"
	"sync"
)

// HelperSubcommand is the hidden berth subcommand a helper runs as.
const HelperSubcommand = "vz-guest"

// Helpers is the agent's Hypervisor over helper processes: Boot starts one
// helper per guest (Command) and every call goes to that guest's helper
// over its stdin and stdout (proto.go). It is also a Killer: Kill SIGKILLs
// the helper, which ends its guest. A helper that has exited holds no
// guest, so its guest is StateAbsent. Safe for concurrent use.
type Helpers struct {
	// Command returns the helper process to start for attempt, without its
	// stdin and stdout (Helpers sets them); nil: this berth binary run as
	// `berth vz-guest`.
	Command func(attempt string) *exec.Cmd
	// CPUs and Memory (bytes) are a guest's when its Guest names none.
	CPUs   uint
	Memory uint64
	Logger *slog.Logger

	mu    sync.Mutex
	procs map[string]*helperProc
}

// helperProc is one running helper and its pending calls.
type helperProc struct {
	attempt string
	cmd     *exec.Cmd
	in      io.WriteCloser
	exited  chan struct{} // closed once the process is reaped

	mu      sync.Mutex
	wmu     sync.Mutex
	next    uint64
	pending map[uint64]chan reply
	broken  error // set once replies can no longer come
}

// ErrHelperGone is wrapped by a call whose helper exited before answering.
var ErrHelperGone = errors.New("vz: the guest's helper process is gone")

func (h *Helpers) logger() *slog.Logger {
	if h.Logger == nil {
		return slog.Default()
	}
	return h.Logger
}

func (h *Helpers) proc(attempt string) *helperProc {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.procs[attempt]
}

// Running is the attempts whose helper process has not exited, sorted:
// each holds at most one VM object, so this is the count of VM objects the
// host holds.
func (h *Helpers) Running() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for a, p := range h.procs {
		select {
		case <-p.exited:
		default:
			out = append(out, a)
		}
	}
	sort.Strings(out)
	return out
}

func (h *Helpers) command(attempt string) (*exec.Cmd, error) {
	if h.Command != nil {
		return h.Command(attempt), nil
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("vz: find the berth binary to run the guest's helper: %w", err)
	}
	return exec.Command(self, HelperSubcommand), nil
}

// start runs a helper for attempt, with pipes this side owns alone (so
// reaping the process never closes a pipe a reader still uses).
func (h *Helpers) start(attempt string) (*helperProc, error) {
	cmd, err := h.command(attempt)
	if err != nil {
		return nil, err
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	cmd.Stdin, cmd.Stdout = inR, outW
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr // the helper logs where the agent does
	}
	if err := cmd.Start(); err != nil {
		inR.Close()
		inW.Close()
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("vz: start the guest's helper %s: %w", cmd.Path, err)
	}
	inR.Close()
	outW.Close()
	p := &helperProc{attempt: attempt, cmd: cmd, in: inW, exited: make(chan struct{}), pending: map[uint64]chan reply{}}
	go p.read(outR)
	go func() {
		err := cmd.Wait()
		inW.Close()
		h.logger().Debug("guest helper exited", "attempt", attempt, "pid", cmd.Process.Pid, "status", err)
		close(p.exited)
	}()
	return p, nil
}

// read delivers replies to their callers until the helper's stdout ends.
func (p *helperProc) read(r io.ReadCloser) {
	defer r.Close()
	for {
		var rep reply
		err := readFrame(r, &rep)
		p.mu.Lock()
		if err != nil {
			p.broken = fmt.Errorf("%w (%s): %v", ErrHelperGone, p.attempt, err)
			for id, c := range p.pending {
				close(c)
				delete(p.pending, id)
			}
			p.mu.Unlock()
			return
		}
		if c, ok := p.pending[rep.ID]; ok {
			c <- rep
			delete(p.pending, rep.ID)
		}
		p.mu.Unlock()
	}
}

// call sends r and waits for its reply, ctx's end, or the helper's exit.
func (p *helperProc) call(ctx context.Context, r request) (State, error) {
	c := make(chan reply, 1)
	p.mu.Lock()
	if p.broken != nil {
		err := p.broken
		p.mu.Unlock()
		return StateAbsent, err
	}
	p.next++
	r.ID = p.next
	p.pending[r.ID] = c
	p.mu.Unlock()
	p.wmu.Lock()
	err := writeFrame(p.in, r)
	p.wmu.Unlock()
	if err != nil {
		p.mu.Lock()
		delete(p.pending, r.ID)
		p.mu.Unlock()
		return StateAbsent, fmt.Errorf("%w (%s): %v", ErrHelperGone, p.attempt, err)
	}
	select {
	case rep, ok := <-c:
		if !ok {
			p.mu.Lock()
			err := p.broken
			p.mu.Unlock()
			return StateAbsent, err
		}
		if rep.Error != "" {
			return rep.State, errors.New(rep.Error)
		}
		return rep.State, nil
	case <-ctx.Done():
		p.mu.Lock()
		delete(p.pending, r.ID)
		p.mu.Unlock()
		return StateAbsent, ctx.Err()
	}
}

// Boot implements Hypervisor: a fresh helper for the guest (a helper left
// by an earlier boot of the same attempt is killed first), told to boot it.
func (h *Helpers) Boot(ctx context.Context, g Guest) error {
	if err := h.Kill(ctx, g.Attempt); err != nil {
		return err
	}
	p, err := h.start(g.Attempt)
	if err != nil {
		return err
	}
	h.mu.Lock()
	if h.procs == nil {
		h.procs = map[string]*helperProc{}
	}
	h.procs[g.Attempt] = p
	h.mu.Unlock()
	cpus, memory := g.size(h.CPUs, h.Memory) // the attempt's machine shape
	_, err = p.call(ctx, request{Op: opBoot, Guest: &g, CPUs: cpus, Memory: memory})
	return err
}

// State implements Hypervisor: a guest without a running helper is absent.
func (h *Helpers) State(ctx context.Context, attempt string) (State, error) {
	p := h.proc(attempt)
	if p == nil || p.gone() {
		return StateAbsent, nil
	}
	st, err := p.call(ctx, request{Op: opState})
	if errors.Is(err, ErrHelperGone) {
		return StateAbsent, nil // it died, and its guest with it
	}
	return st, err
}

func (p *helperProc) gone() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// op sends a stop-side operation; a guest without a helper has nothing to
// stop.
func (h *Helpers) op(ctx context.Context, attempt, op string) error {
	p := h.proc(attempt)
	if p == nil || p.gone() {
		return nil
	}
	_, err := p.call(ctx, request{Op: op})
	return err
}

// DetachNetwork implements Hypervisor.
func (h *Helpers) DetachNetwork(ctx context.Context, attempt string) error {
	return h.op(ctx, attempt, opDetachNetwork)
}

// RequestStop implements Hypervisor.
func (h *Helpers) RequestStop(ctx context.Context, attempt string) error {
	return h.op(ctx, attempt, opRequestStop)
}

// ForceStop implements Hypervisor.
func (h *Helpers) ForceStop(ctx context.Context, attempt string) error {
	return h.op(ctx, attempt, opForceStop)
}

// Drop implements Hypervisor: the helper frees its guest's objects and
// exits; one that does not exit before ctx ends is killed.
func (h *Helpers) Drop(ctx context.Context, attempt string) error {
	p := h.proc(attempt)
	if p == nil {
		return nil
	}
	if !p.gone() {
		_, err := p.call(ctx, request{Op: opDrop})
		if err == nil {
			select {
			case <-p.exited:
			case <-ctx.Done():
			}
		}
	}
	return h.Kill(ctx, attempt)
}

// Kill implements Killer: SIGKILL the guest's helper and wait until it is
// reaped (its guest ends with it), or ctx ends.
func (h *Helpers) Kill(ctx context.Context, attempt string) error {
	p := h.proc(attempt)
	if p == nil {
		return nil
	}
	if !p.gone() {
		h.logger().Warn("killing the guest's helper process: its guest did not stop", "attempt", attempt, "pid", p.cmd.Process.Pid)
		_ = p.cmd.Process.Kill()
	}
	select {
	case <-p.exited:
	case <-ctx.Done():
		return fmt.Errorf("vz: the helper of %s (pid %d) did not exit after SIGKILL: %w", attempt, p.cmd.Process.Pid, ctx.Err())
	}
	h.mu.Lock()
	if h.procs[attempt] == p {
		delete(h.procs, attempt)
	}
	h.mu.Unlock()
	return nil
}

// Close kills every helper and waits for them (an agent's shutdown; a
// helper also exits by itself when the agent's end of its stdin closes).
func (h *Helpers) Close(ctx context.Context) error {
	h.mu.Lock()
	var all []string
	for a := range h.procs {
		all = append(all, a)
	}
	h.mu.Unlock()
	var errs []error
	for _, a := range all {
		errs = append(errs, h.Kill(ctx, a))
	}
	return errors.Join(errs...)
}
