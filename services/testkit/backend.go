package testkit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/berth-ci/berth/services/vmagent/backend"
)

// Behaviour is what the fake Backend does on one call.
type Behaviour int

const (
	// Succeed returns nil at once.
	Succeed Behaviour = iota
	// Fail returns an error at once.
	Fail
	// Hang blocks, ignoring the call's context like a hung hypervisor call,
	// until Release (or cleanup), then returns an error.
	Hang
	// HangThenSucceed blocks, ignoring the context, until Late (then
	// returns nil) or Release (then an error): a stop that lands late.
	HangThenSucceed
	// HangFirst hangs the first call (as Hang) and lets later ones succeed.
	HangFirst
)

// Step names a Backend method a behaviour is set for.
const (
	StepCreate = "create"
	StepStop   = "stop"
	StepAssign = "assign"
	// StepList is counted (Count, Calls with attempt "") but takes no
	// behaviour: SetInventory decides what List answers.
	StepList = "list"
)

// ErrFake is what every failing fake call wraps.
var ErrFake = errors.New("fake backend")

// Call is what the fake Backend saw on one call: the VM, and for create and
// assign the JIT config file's content and permission bits at call time.
type Call struct {
	VM      backend.VM
	JIT     []byte
	JITMode os.FileMode
	JITErr  error
}

// Backend is a backend.Backend told per step and attempt what to do
// (SetBehaviour), counting calls and live VMs (a successful create makes
// an attempt live, a successful stop ends it). Its zero value is not
// usable: use NewBackend. Safe for concurrent use.
type Backend struct {
	release  chan struct{}
	late     chan struct{}
	once     sync.Once
	lateOnce sync.Once

	mu        sync.Mutex
	plan      map[string]Behaviour // "<step>/<attempt>", or "<step>/" for every attempt
	calls     map[string][]Call
	live      map[string]bool
	inventory []string
	listErr   error
	useList   bool
	physCap   int
	noAssign  bool
}

// NewBackend returns a fake whose every call succeeds; hung calls return
// at cleanup.
func NewBackend(t interface{ Cleanup(func()) }) *Backend {
	b := &Backend{release: make(chan struct{}), late: make(chan struct{}),
		plan: map[string]Behaviour{}, calls: map[string][]Call{}, live: map[string]bool{}}
	t.Cleanup(b.Release)
	return b
}

// SetBehaviour makes step (StepCreate, StepStop, StepAssign) of attempt
// behave as given; attempt "" sets it for every attempt without its own.
func (b *Backend) SetBehaviour(step, attempt string, be Behaviour) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.plan[step+"/"+attempt] = be
}

// SetInventory makes List report these attempt ids, or fail with err when
// err is not nil. Without it List reports the live VMs.
func (b *Backend) SetInventory(ids []string, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inventory, b.listErr, b.useList = append([]string(nil), ids...), err, true
}

// Release ends every hung call (with an error); idempotent.
func (b *Backend) Release() { b.once.Do(func() { close(b.release) }) }

// Late lets every HangThenSucceed call return nil; idempotent.
func (b *Backend) Late() { b.lateOnce.Do(func() { close(b.late) }) }

// Calls is every call to step for attempt so far (a copy).
func (b *Backend) Calls(step, attempt string) []Call {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.calls[step+"/"+attempt])
}

// Count is how many calls step has had, over all attempts.
func (b *Backend) Count(step string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for k, cs := range b.calls {
		if strings.HasPrefix(k, step+"/") {
			n += len(cs)
		}
	}
	return n
}

// Live is the attempts created and not yet stopped, sorted.
func (b *Backend) Live() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for a := range b.live {
		out = append(out, a)
	}
	slices.Sort(out)
	return out
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "fake" }

// SetPhysicalCap makes PhysicalCap report n VMs (0, the default: no
// limit of the backend's own).
func (b *Backend) SetPhysicalCap(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.physCap = n
}

// SetAssign makes CanAssign report can (true by default); without it
// Assign returns backend.ErrNoAssign.
func (b *Backend) SetAssign(can bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.noAssign = !can
}

// PhysicalCap implements backend.Backend.
func (b *Backend) PhysicalCap() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.physCap
}

// CanAssign implements backend.Backend.
func (b *Backend) CanAssign() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.noAssign
}

// Create implements backend.Backend.
func (b *Backend) Create(ctx context.Context, vm backend.VM) error { return b.do(StepCreate, vm) }

// Stop implements backend.Backend.
func (b *Backend) Stop(ctx context.Context, vm backend.VM) error { return b.do(StepStop, vm) }

// Assign implements backend.Backend; after SetAssign(false) it returns
// backend.ErrNoAssign.
func (b *Backend) Assign(ctx context.Context, vm backend.VM) error {
	if !b.CanAssign() {
		return backend.ErrNoAssign
	}
	return b.do(StepAssign, vm)
}

// List implements backend.Backend: SetInventory's answer, or the live VMs.
func (b *Backend) List(ctx context.Context) ([]string, error) {
	b.mu.Lock()
	b.calls[StepList+"/"] = append(b.calls[StepList+"/"], Call{})
	useList, inv, err := b.useList, slices.Clone(b.inventory), b.listErr
	b.mu.Unlock()
	if !useList {
		return b.Live(), nil
	}
	if err != nil {
		return nil, err
	}
	return inv, nil
}

func (b *Backend) do(step string, vm backend.VM) error {
	c := Call{VM: vm}
	if (step == StepCreate || step == StepAssign) && vm.JITConfigFile != "" {
		c.JIT, c.JITErr = os.ReadFile(vm.JITConfigFile)
		if st, err := os.Stat(vm.JITConfigFile); err == nil {
			c.JITMode = st.Mode().Perm()
		}
	}
	key := step + "/" + vm.Attempt
	b.mu.Lock()
	b.calls[key] = append(b.calls[key], c)
	n := len(b.calls[key])
	be, ok := b.plan[key]
	if !ok {
		be = b.plan[step+"/"]
	}
	b.mu.Unlock()
	err := b.behave(step, be, n)
	if err == nil {
		b.mu.Lock()
		switch step {
		case StepCreate:
			b.live[vm.Attempt] = true
		case StepStop:
			delete(b.live, vm.Attempt)
		}
		b.mu.Unlock()
	}
	return err
}

func (b *Backend) behave(step string, be Behaviour, nth int) error {
	hung := func() error {
		<-b.release
		return fmt.Errorf("%w: %s returned only when released", ErrFake, step)
	}
	switch be {
	case Fail:
		return fmt.Errorf("%w: %s: out of disk", ErrFake, step)
	case Hang:
		return hung()
	case HangThenSucceed:
		select {
		case <-b.late:
			return nil
		case <-b.release:
			return fmt.Errorf("%w: %s returned only when released", ErrFake, step)
		}
	case HangFirst:
		if nth == 1 {
			return hung()
		}
	}
	return nil
}
