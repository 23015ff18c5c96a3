package vz

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/services/vmagent/backend"
	"github.com/berth-ci/berth/services/vmagent/runnerlog"
)

// guestScript is the daemon shipped for guest images.
var guestScript = filepath.Join("..", "..", "..", "..", "deploy", "guest", "berth-guest.sh")

// scriptHV boots a "guest" that is the shipped berth-guest.sh, run by
// /bin/sh on the attempt's shared directory, with a fake actions/runner:
// what the guest side does is tested here; only the macOS around it is not.
type scriptHV struct {
	runnerDir string
	mu        sync.Mutex
	procs     map[string]*exec.Cmd
	exited    map[string]chan struct{}
}

func (h *scriptHV) Boot(ctx context.Context, g Guest) error {
	cmd := exec.Command("/bin/sh", guestScript)
	cmd.Env = append(os.Environ(), "BERTH_SHARE="+g.SharedDir, "BERTH_RUNNER_DIR="+h.runnerDir, "BERTH_POLL=0.01")
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	h.mu.Lock()
	h.procs[g.Attempt], h.exited[g.Attempt] = cmd, done
	h.mu.Unlock()
	return nil
}

func (h *scriptHV) proc(a string) (*exec.Cmd, chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.procs[a], h.exited[a]
}

func (h *scriptHV) State(ctx context.Context, a string) (State, error) {
	_, done := h.proc(a)
	if done == nil {
		return StateAbsent, nil
	}
	select {
	case <-done:
		return StateStopped, nil
	default:
		return StateRunning, nil
	}
}

func (h *scriptHV) RequestStop(ctx context.Context, a string) error {
	if cmd, _ := h.proc(a); cmd != nil {
		return cmd.Process.Kill()
	}
	return nil
}
func (h *scriptHV) ForceStop(ctx context.Context, a string) error     { return h.RequestStop(ctx, a) }
func (h *scriptHV) DetachNetwork(ctx context.Context, a string) error { return nil }
func (h *scriptHV) Drop(ctx context.Context, a string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.procs, a)
	delete(h.exited, a)
	return nil
}

// fakeRunner is an actions/runner directory whose run.sh records its
// arguments (whole: written aside, then renamed, so a reader never sees
// the file empty), prints its version as actions/runner does, then exits with
// status 3 once the file "finish" appears.
func fakeRunner(t *testing.T) string {
	dir := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "bin", "Runner.Listener"), []byte("#!/bin/sh\necho 2.330.0\n"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "run.sh"), []byte(`#!/bin/sh
printf '%s\n' "$@" > "$(dirname "$0")/args.tmp"
mv "$(dirname "$0")/args.tmp" "$(dirname "$0")/args"
echo "Current runner version: '2.330.0'"
while [ ! -e "$(dirname "$0")/finish" ]; do sleep 0.01; done
exit 3
`), 0o755))
	return dir
}

// The guest side works on the backend's contract: a cold guest's runner
// starts with the JIT config put there before boot; a warm guest waits,
// then starts it when Assign puts it on the share; both report started
// (with the runner's version) and exited (with its status).
func TestTheShippedGuestDaemonStartsTheRunnerFromTheShare(t *testing.T) {
	for _, warm := range []bool{false, true} {
		name := map[bool]string{false: "cold", true: "warm"}[warm]
		t.Run(name, func(t *testing.T) {
			runner := fakeRunner(t)
			fx := newFixture(t, func(c *Config) { c.RunnerTimeout = 20 * time.Second })
			hv := &scriptHV{runnerDir: runner, procs: map[string]*exec.Cmd{}, exited: map[string]chan struct{}{}}
			fx.b.hv = hv
			vm := fx.vm("berth-8-1")
			ctx := deadline(t, 20*time.Second)
			shared := filepath.Join(fx.root, "berth-8-1", SharedDir)
			args := filepath.Join(runner, "args")
			if warm {
				cold := vm
				vm.Warm, vm.JITConfigFile = true, ""
				must(t, fx.b.Create(ctx, vm))
				if _, err := os.Stat(args); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("a warm guest started its runner before its assign: %v", err)
				}
				if got, _ := os.ReadFile(filepath.Join(shared, GuestReady)); strings.TrimSpace(string(got)) != "2.330.0" {
					t.Errorf("guest-ready = %q; want the runner's version", got)
				}
				must(t, fx.b.Assign(ctx, cold))
			} else {
				must(t, fx.b.Create(ctx, vm))
			}
			testkit.Eventually(t, 20*time.Second, "run.sh's arguments", func() bool { _, err := os.Stat(args); return err == nil })
			got, _ := os.ReadFile(args)
			if string(got) != "--jitconfig\nencoded-jit\n" {
				t.Errorf("run.sh got %q; want --jitconfig and the encoded config", got)
			}
			// The daemon writes runner-started once the runner printed its
			// version: after run.sh's arguments, not with them.
			testkit.Eventually(t, 20*time.Second, "runner-started with the runner's version", func() bool {
				got, _ := os.ReadFile(filepath.Join(shared, RunnerStarted))
				return strings.TrimSpace(string(got)) == "2.330.0"
			})
			testkit.Eventually(t, 20*time.Second, "the runner's output on the share", func() bool {
				out, err := fx.b.RunnerOutput(ctx, vm)
				return err == nil && runnerlog.Read(out).Version == "2.330.0"
			})
			must(t, os.WriteFile(filepath.Join(runner, "finish"), nil, 0o600))
			testkit.Eventually(t, 20*time.Second, "runner-exited", func() bool {
				b, err := os.ReadFile(filepath.Join(shared, RunnerExited))
				return err == nil && strings.TrimSpace(string(b)) == "3"
			})
			must(t, fx.b.Stop(ctx, fx.vm("berth-8-1")))
		})
	}
}

// An image without a runner fails its create at once, as the image's
// fault, saying what to install.
func TestAGuestWithoutARunnerFailsAsTheImagesFault(t *testing.T) {
	fx := newFixture(t, func(c *Config) { c.RunnerTimeout = 20 * time.Second })
	fx.b.hv = &scriptHV{runnerDir: t.TempDir(), procs: map[string]*exec.Cmd{}, exited: map[string]chan struct{}{}}
	err := fx.b.Create(deadline(t, 20*time.Second), fx.vm("berth-9-1"))
	if !errors.Is(err, backend.ErrImage) || !strings.Contains(err.Error(), "install actions/runner") {
		t.Fatalf("Create = %v; want the image's fault, naming what to install", err)
	}
	must(t, fx.b.Stop(deadline(t, 5*time.Second), fx.vm("berth-9-1")))
}
