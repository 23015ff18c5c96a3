//go:build darwin && arm64 && cgo

package vz

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

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
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := os.WriteFile(src, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := platformClone(src, dst); err != nil {
		t.Errorf("clonefile on %s (an APFS volume?): %v", dir, err)
	}
}

// With BERTH_VZ_BASE_IMAGE (a macOS guest bundle whose launch daemon writes
// runner-started, see the package doc) a real guest is created and stopped.
// The test binary needs the com.apple.security.virtualization entitlement:
// go test -c, codesign it with deploy/launchd/berth.entitlements, run it.
func TestRealGuestCreateAndStop(t *testing.T) {
	base := os.Getenv("BERTH_VZ_BASE_IMAGE")
	if base == "" {
		t.Skip("set BERTH_VZ_BASE_IMAGE to a base guest directory to boot a real guest")
	}
	hv, err := NewPlatformHypervisor(4, 8<<30)
	if err != nil {
		t.Fatal(err)
	}
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
	if err := b.Stop(stopCtx, vm); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if createErr != nil {
		t.Fatalf("Create: %v", createErr)
	}
}
