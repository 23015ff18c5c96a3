package bench

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/berth-ci/berth/services/vmagent/backend"
	"github.com/berth-ci/berth/tests/ghsim"
)

// InProc is a vmagent backend whose "VM" is a simulated runner goroutine
// (ghsim.RunRunner) in this process: no process is spawned per job, so the
// bench measures Berth rather than fork and exec. Create starts the runner
// with the JIT config the agent wrote to vm.JITConfigFile (or, wrapped as
// an InMemoryJIT, handed over in vm.JITConfig); Stop cancels it.
// With Wedge set, Stop never returns (until Close): every teardown hangs,
// like a macOS VM stop that never came back.
type InProc struct {
	Wedge bool
	// Boot is how long a create takes before the VM runs (a VM's boot);
	// WarmCapable lets the host keep warm VMs: a warm create boots and
	// waits, and Assign starts its runner at once.
	Boot        time.Duration
	WarmCapable bool

	root    context.Context
	cancel  context.CancelFunc
	unwedge chan struct{}
	wg      sync.WaitGroup

	mu       sync.Mutex
	live     map[string]*simVM
	closed   bool
	failures int
}

type simVM struct {
	cancel context.CancelFunc
	done   chan struct{}
	warm   bool // booted, waiting for Assign
}

// NewInProc returns a backend; Close it after the agent has stopped.
func NewInProc(wedge bool) *InProc {
	ctx, cancel := context.WithCancel(context.Background())
	return &InProc{Wedge: wedge, root: ctx, cancel: cancel, unwedge: make(chan struct{}), live: map[string]*simVM{}}
}

// Name implements backend.Backend.
func (b *InProc) Name() string { return "bench-inproc" }

// PhysicalCap implements backend.Backend: no limit of its own.
func (b *InProc) PhysicalCap() int { return 0 }

// CanAssign implements backend.Backend.
func (b *InProc) CanAssign() bool { return b.WarmCapable }

// Assign implements backend.Backend: the warm VM's runner starts now.
func (b *InProc) Assign(ctx context.Context, vm backend.VM) error {
	if !b.WarmCapable {
		return backend.ErrNoAssign
	}
	b.mu.Lock()
	if v := b.live[vm.Attempt]; v != nil && v.warm {
		delete(b.live, vm.Attempt) // the waiting VM becomes the running one
	}
	b.mu.Unlock()
	return b.startRunner(vm)
}

// Create implements backend.Backend: it boots (Boot), then starts the
// runner, or for a warm VM only registers it, and returns.
func (b *InProc) Create(ctx context.Context, vm backend.VM) error {
	if b.Boot > 0 {
		select {
		case <-time.After(b.Boot):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if vm.Warm {
		b.mu.Lock()
		defer b.mu.Unlock()
		if _, ok := b.live[vm.Attempt]; !ok {
			done := make(chan struct{})
			close(done)
			b.live[vm.Attempt] = &simVM{cancel: func() {}, done: done, warm: true}
		}
		return nil
	}
	return b.startRunner(vm)
}

// inMemoryJIT is an InProc that takes its JIT configs in memory
// (backend.InMemoryJIT), as the ec2 backend does.
type inMemoryJIT struct{ *InProc }

func (inMemoryJIT) InMemoryJIT() {}

// startRunner runs the simulated runner with the JIT config in vm, or in
// vm's file.
func (b *InProc) startRunner(vm backend.VM) error {
	raw := vm.JITConfig
	if raw == nil {
		var err error
		if raw, err = os.ReadFile(vm.JITConfigFile); err != nil {
			return fmt.Errorf("read JIT config: %w", err)
		}
	}
	enc := strings.TrimSpace(string(raw))
	if _, err := ghsim.DecodeJITConfig(enc); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return fmt.Errorf("backend closed")
	}
	if _, ok := b.live[vm.Attempt]; ok {
		return nil // created already: idempotent per attempt
	}
	rctx, cancel := context.WithCancel(b.root)
	v := &simVM{cancel: cancel, done: make(chan struct{})}
	b.live[vm.Attempt] = v
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer close(v.done)
		defer cancel()
		if err := ghsim.RunRunner(rctx, enc, nil); err != nil && rctx.Err() == nil {
			b.mu.Lock()
			b.failures++
			b.mu.Unlock()
		}
	}()
	return nil
}

// Stop implements backend.Backend: it cancels the runner and waits for it,
// or, wedged, blocks until Close whatever its context says.
func (b *InProc) Stop(ctx context.Context, vm backend.VM) error {
	if b.Wedge {
		<-b.unwedge
		return nil
	}
	b.mu.Lock()
	v := b.live[vm.Attempt]
	delete(b.live, vm.Attempt)
	b.mu.Unlock()
	if v == nil {
		return nil
	}
	v.cancel()
	select {
	case <-v.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// List implements backend.Backend: the attempts whose VM exists.
func (b *InProc) List(ctx context.Context) ([]string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]string, 0, len(b.live))
	for id := range b.live {
		out = append(out, id)
	}
	sort.Strings(out)
	return out, nil
}

// RunnerFailures counts runners that ended with an error of their own (not
// a stop): the simulator refused them or was unreachable.
func (b *InProc) RunnerFailures() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.failures
}

// Close releases wedged stops, stops every runner and waits for them.
func (b *InProc) Close() {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.unwedge)
	}
	b.mu.Unlock()
	b.cancel()
	b.wg.Wait()
}
