// Package vztest runs the vz backend's helper processes on any OS: a fake
// Hypervisor that plays a macOS guest and its berth daemon on the files of
// the share, served by the real helper protocol (vz.Serve) from a test
// binary re-executed as the helper. Tests call ServeIfHelper first in
// their TestMain and give vz.Helpers a Command from Command.
package vztest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/berth-ci/berth/services/clock"
	"github.com/berth-ci/berth/services/vmagent/backends/vz"
)

// helperEnv names the behaviour a re-executed test binary serves as helper.
const helperEnv = "BERTH_VZTEST_HELPER"

// Behaviours of the fake guest's stop calls.
const (
	// Stops: a stop request shuts the guest down at once.
	Stops = "stops"
	// WedgedStop: DetachNetwork, RequestStop and ForceStop never return,
	// ignoring their context, like the framework's stop that neither
	// returns nor throws.
	WedgedStop = "wedged-stop"
)

// ServeIfHelper serves the helper protocol on stdin and stdout and exits
// when this process was started as a helper by Command; it returns at
// once otherwise. Call it first in TestMain.
func ServeIfHelper() {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		return
	}
	err := vz.Serve(context.Background(), os.Stdin, os.Stdout, func(cpus uint, memory uint64) (vz.Hypervisor, error) {
		f := NewFake(mode)
		f.cpus, f.memory = cpus, memory
		return f, nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "vztest helper:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// Command returns a vz.Helpers Command that re-executes this test binary
// as a helper whose guest behaves as mode(attempt) says.
func Command(mode func(attempt string) string) func(attempt string) *exec.Cmd {
	return func(attempt string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"="+mode(attempt))
		return cmd
	}
}

// Fake is a Hypervisor holding one guest at most, as a helper does. Its
// guest's berth daemon writes guest-ready at boot and runner-started once
// jitconfig is on the share (at once when it is there at boot).
type Fake struct {
	mode   string
	cpus   uint   // the machine the helper was asked to boot
	memory uint64 // bytes

	mu      sync.Mutex
	state   map[string]vz.State
	objects map[string]bool
	stop    chan struct{}
}

// NewFake returns a fake whose stops behave as mode (Stops, WedgedStop).
func NewFake(mode string) *Fake {
	return &Fake{mode: mode, state: map[string]vz.State{}, objects: map[string]bool{}, stop: make(chan struct{})}
}

// MachineFile is written by a helper's fake into the guest's directory at
// boot: the CPUs and memory the helper was asked to give the guest, as
// "cpus=N memory=BYTES".
const MachineFile = "fake-machine"

// Boot implements vz.Hypervisor.
func (f *Fake) Boot(ctx context.Context, g vz.Guest) error {
	if err := os.WriteFile(g.MachineIDFile, []byte("fake-"+g.Attempt), 0o600); err != nil {
		return err
	}
	machine := fmt.Sprintf("cpus=%d memory=%d", f.cpus, f.memory)
	if err := os.WriteFile(filepath.Join(g.Dir, MachineFile), []byte(machine), 0o600); err != nil {
		return err
	}
	f.mu.Lock()
	f.state[g.Attempt], f.objects[g.Attempt] = vz.StateRunning, true
	f.mu.Unlock()
	if err := os.WriteFile(filepath.Join(g.SharedDir, vz.GuestReady), nil, 0o600); err != nil {
		return err
	}
	jit := filepath.Join(g.SharedDir, vz.JITConfigName)
	started := filepath.Join(g.SharedDir, vz.RunnerStarted)
	if _, err := os.Stat(jit); err == nil {
		return os.WriteFile(started, nil, 0o600)
	}
	// A warm guest: its daemon polls the share, as the real one does.
	go func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-f.stop:
				return
			case <-tick.C:
				if _, err := os.Stat(jit); err == nil {
					_ = os.WriteFile(started, nil, 0o600)
					return
				}
			}
		}
	}()
	return nil
}

func (f *Fake) wedge() {
	if f.mode == WedgedStop {
		select {} // never returns, whatever its context says
	}
}

func (f *Fake) off(attempt string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.objects[attempt] {
		f.state[attempt] = vz.StateStopped
	}
}

// DetachNetwork implements vz.Hypervisor.
func (f *Fake) DetachNetwork(ctx context.Context, attempt string) error {
	f.wedge()
	return nil
}

// RequestStop implements vz.Hypervisor.
func (f *Fake) RequestStop(ctx context.Context, attempt string) error {
	f.wedge()
	f.off(attempt)
	return nil
}

// ForceStop implements vz.Hypervisor.
func (f *Fake) ForceStop(ctx context.Context, attempt string) error {
	f.wedge()
	f.off(attempt)
	return nil
}

// State implements vz.Hypervisor.
func (f *Fake) State(ctx context.Context, attempt string) (vz.State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state[attempt], nil
}

// Drop implements vz.Hypervisor: the VM object is gone. It fails while
// the guest runs (a drop of a running guest is a bug in the backend).
func (f *Fake) Drop(ctx context.Context, attempt string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if st := f.state[attempt]; st == vz.StateRunning {
		return fmt.Errorf("drop of %s while it runs", attempt)
	}
	if f.objects[attempt] {
		close(f.stop)
	}
	delete(f.objects, attempt)
	delete(f.state, attempt)
	return nil
}

// Objects is how many VM objects the fake holds.
func (f *Fake) Objects() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.objects)
}

// Drive moves fk on by step whenever the code under test has a timer
// armed, until the returned stop is called: phases bounded on fk pass in
// fake time as fast as the code reaches them. Drive only through waits on
// nothing real (a wedged stop): it does not wait for a helper's answer, so
// it can end a phase whose answer is on its way.
func Drive(fk *clock.Fake, step time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			armed := fk.Armed()
			if fk.Timers() > 0 {
				fk.Advance(step)
				continue
			}
			select {
			case <-done:
				return
			case <-armed:
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}
