// Package backend is the one interface through which a vmagent reaches VMs.
// Deadlines, abandonment and disjoint naming are the agent's business, not
// the backend's: every call gets a context with a deadline and must return
// when it ends.
package backend

import (
	"context"
	"errors"
	"io"
	"os"

	"github.com/berth-ci/berth/events"
)

// ErrNoInventory is returned by List when the backend cannot list its VMs;
// the agent then runs no orphan sweep.
var ErrNoInventory = errors.New("backend has no inventory")

// VM describes one attempt's VM. Every resource a backend creates must be
// named or tagged by Attempt, so that a late teardown of one attempt can only
// touch that attempt (law 4).
type VM struct {
	Attempt string
	Pool    string
	Host    string
	Labels  []string
	JobID   int64 // the job the attempt was booked for (it may run another)
	// JITConfigFile is the path of a file (mode 0600) holding the encoded
	// JIT runner configuration, removed by the agent after teardown; empty
	// for an InMemoryJIT backend, which gets JITConfig instead.
	JITConfigFile string
	// JITConfig is the encoded JIT runner configuration itself, set only
	// for an InMemoryJIT backend (nil for a warm VM's first boot).
	JITConfig []byte
	// WorkDir is a directory owned by this attempt alone; empty for an
	// InMemoryJIT backend, which the agent makes none for.
	WorkDir string
	// Shape is the machine the attempt's pool declares (CPU, memory, disk,
	// image, instance types; events/shape.go), nil when it declares none:
	// a backend sizes and images the VM by it where it can, and keeps its
	// own settings for the fields left zero.
	Shape *events.Shape
	// Warm: Create boots the VM without a JIT config (JITConfigFile is
	// empty) and returns when it is ready; Assign later starts its runner
	// with the JIT config (issue 8).
	Warm bool
}

// ErrNoAssign is returned by Assign when the backend cannot hand a JIT
// config to a VM that is already running (it keeps no warm VMs).
var ErrNoAssign = errors.New("backend has no assign step")

// Backend creates and stops VMs.
type Backend interface {
	// Name is the backend's kind, e.g. "exec".
	Name() string
	// Create boots the VM and starts its runner with the JIT config. It
	// returns when the runner has been started.
	Create(ctx context.Context, vm VM) error
	// Stop stops and destroys the VM. A VM that does not exist is stopped.
	Stop(ctx context.Context, vm VM) error
	// List returns the attempt ids of the VMs that exist on the host, as the
	// hypervisor or cloud sees them, or ErrNoInventory.
	List(ctx context.Context) ([]string, error)
	// PhysicalCap is how many VMs the host can run at once by the backend's
	// own limit (vz: 2 macOS guests, Apple's licence and the framework's
	// cap), or 0 when the backend has none and the agent's physical_cap
	// alone decides. The agent advertises the smaller of the two.
	PhysicalCap() int
	// CanAssign reports whether Assign works, so the host may keep warm
	// VMs; the agent advertises it.
	CanAssign() bool
	// Assign starts the runner of a warm VM (booted by Create with
	// vm.Warm) with the JIT config now in vm.JITConfigFile, and returns
	// when the runner was started; ErrNoAssign without an assign step.
	Assign(ctx context.Context, vm VM) error
}

// InMemoryJIT is a Backend that takes the JIT config in vm.JITConfig and
// keeps nothing of an attempt on the host's disk (ec2: the config goes
// into the instance's user data). For such a backend the agent makes no
// attempt directory and writes no file: a runner's credential never
// touches the host's disk, and a VM costs the host no filesystem calls
// (a mkdir, a create, a write and a removal, about 0.3 ms of CPU each VM
// on the bench's machine).
type InMemoryJIT interface {
	Backend
	// InMemoryJIT marks the backend; it is never called.
	InMemoryJIT()
}

// RunnerOutput is a Backend that can read what an attempt's runner printed
// (its stdout and stderr), so the agent can report the runner's version
// and GitHub's refusal of it (package runnerlog). A backend that cannot
// see its runners' output (ec2) does not implement it.
type RunnerOutput interface {
	// RunnerOutput returns the last MaxRunnerOutput bytes the attempt's
	// runner printed so far; nothing (and no error) before it printed.
	RunnerOutput(ctx context.Context, vm VM) ([]byte, error)
}

// MaxRunnerOutput bounds what RunnerOutput returns: a runner that took no
// job has printed a few hundred bytes.
const MaxRunnerOutput = 64 << 10

// RunnerLogName is the file a runner's output goes to in the attempt's
// own directory (exec: WorkDir/runner.log, given to the commands as
// BERTH_RUNNER_LOG; vz: the guest's share).
const RunnerLogName = "runner.log"

// ReadTail returns the last MaxRunnerOutput bytes of the file at path; a
// file that does not exist yet is no output.
func ReadTail(path string) ([]byte, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if off := fi.Size() - MaxRunnerOutput; off > 0 {
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			return nil, err
		}
	}
	return io.ReadAll(io.LimitReader(f, MaxRunnerOutput))
}

// StopReporter is a Backend whose stop escalates (vz: ask, force, kill the
// process holding the guest) and says how each stop ended, so the agent
// records it on the attempt's stopped fact.
type StopReporter interface {
	// StopReport is Stop, also returning how the VM ended: one of
	// events.StopClean, events.StopForced, events.StopKilled ("" when
	// there was nothing to stop).
	StopReport(ctx context.Context, vm VM) (ended string, err error)
}

// Wrapper is a Backend that wraps another (the agent's step metrics): As
// looks through it for what the wrapped backend can do.
type Wrapper interface {
	Unwrap() Backend
}

// As finds, in b or in what b wraps (Wrapper, outermost first), the first
// backend that is a T: an optional capability (RunnerOutput, InMemoryJIT)
// of a backend behind a wrapper that does not have the method itself.
// Like errors.As, for backends.
func As[T any](b Backend) (T, bool) {
	for b != nil {
		if t, ok := b.(T); ok {
			return t, true
		}
		w, ok := b.(Wrapper)
		if !ok {
			break
		}
		b = w.Unwrap()
	}
	var zero T
	return zero, false
}

// StopEnded runs b's stop step and says how it ended the VM when b is a
// StopReporter ("" otherwise).
func StopEnded(ctx context.Context, b Backend, vm VM) (string, error) {
	if r, ok := b.(StopReporter); ok {
		return r.StopReport(ctx, vm)
	}
	return "", b.Stop(ctx, vm)
}
