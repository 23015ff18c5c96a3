//go:build darwin && arm64 && cgo

package vz

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/vmagent/backend"
)

// On a Mac (make vz-test): the real hypervisor is registered, knows no
// guest it did not boot, and clones with APFS clonefile.
func TestFrameworkIsRegisteredAndKnowsNoStrangers(t *testing.T) {
	hv, err := NewPlatformHypervisor(2, 4<<30)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if st, err := hv.State(ctx, "berth-1-1"); err != nil || st != StateAbsent {
		t.Errorf("State of an unknown guest = %v, %v; want absent", st, err)
	}
	if err := hv.RequestStop(ctx, "berth-1-1"); err != nil {
		t.Errorf("RequestStop of an unknown guest: %v", err)
	}
	if err := hv.ForceStop(ctx, "berth-1-1"); err != nil {
		t.Errorf("ForceStop of an unknown guest: %v", err)
	}
	if err := hv.DetachNetwork(ctx, "berth-1-1"); err != nil {
		t.Errorf("DetachNetwork of an unknown guest: %v", err)
	}
	if err := hv.Drop(ctx, "berth-1-1"); err != nil {
		t.Errorf("Drop of an unknown guest: %v", err)
	}
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := os.WriteFile(src, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := platformClone(src, dst); err != nil {
		t.Errorf("clonefile on %s (an APFS volume?): %v", dir, err)
	}
}

// With BERTH_VZ_BASE_IMAGE (a macOS guest bundle with the berth daemon of
// deploy/guest, docs/macos.md) a real guest is created in a helper process
// (this test binary re-executed), and stopped: the network detached, a
// graceful stop, the VM dropped and the helper gone. The test binary needs
// the com.apple.security.virtualization entitlement: make vz-test signs it.
func TestRealGuestCreateAndStop(t *testing.T) {
	base := os.Getenv("BERTH_VZ_BASE_IMAGE")
	if base == "" {
		t.Skip("set BERTH_VZ_BASE_IMAGE to a base guest directory to boot a real guest")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	hv := &Helpers{CPUs: 4, Memory: 8 << 30, Command: func(string) *exec.Cmd {
		cmd := exec.Command(self, "-test.run=^$")
		cmd.Env = append(os.Environ(), testHelperEnv+"=1")
		return cmd
	}}
	b, err := New(Config{BaseImage: base, ClonesRoot: filepath.Join(filepath.Dir(base), "berth-test-clones"), RunnerTimeout: 10 * time.Minute}, hv)
	if err != nil {
		t.Fatal(err)
	}
	jit := filepath.Join(t.TempDir(), "jitconfig")
	if err := os.WriteFile(jit, []byte("not-a-real-jit-config"), 0o600); err != nil {
		t.Fatal(err)
	}
	vm := backend.VM{Attempt: "berth-1-1", JITConfigFile: jit}
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	createErr := b.Create(ctx, vm)
	stopCtx, stopCancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer stopCancel()
	ended, err := b.StopReport(stopCtx, vm)
	if err != nil {
		t.Errorf("Stop: %v", err)
	}
	t.Logf("the stop ended %q", ended)
	if got := hv.Running(); len(got) != 0 {
		t.Errorf("helpers left after the stop: %v", got)
	}
	if createErr != nil {
		t.Fatalf("Create: %v", createErr)
	}
	if ended != events.StopClean {
		t.Errorf("a guest with the berth daemon should shut down when asked; the stop ended %q", ended)
	}
}
