package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/services/vmagent/backends/vz"
)

// The built berth binary is the vz backend's helper: it speaks the helper
// protocol on stdin and stdout (here, off macOS, a boot says it needs
// Virtualization.framework), exits when dropped, and is not listed in
// berth's help.
func TestBerthServesAsTheGuestHelper(t *testing.T) {
	if runtime.GOOS == "darwin" {
		t.Skip("on a Mac a boot would start a real guest: make vz-test covers it")
	}
	bin, dir := buildBerth(t)
	h := &vz.Helpers{Command: func(string) *exec.Cmd { return exec.Command(bin, vz.HelperSubcommand) }}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	defer h.Close(ctx)
	g := vz.Guest{Attempt: "berth-1-1", Dir: dir, MachineIDFile: filepath.Join(dir, vz.MachineIDFile), SharedDir: filepath.Join(dir, vz.SharedDir)}

	err := h.Boot(ctx, g)
	if err == nil || !strings.Contains(err.Error(), "macOS on Apple silicon") {
		t.Fatalf("Boot through berth %s = %v; want the platform's refusal, answered over the pipe", vz.HelperSubcommand, err)
	}
	if st, err := h.State(ctx, "berth-1-1"); err != nil || st != vz.StateAbsent {
		t.Errorf("State = %v, %v; want absent", st, err)
	}
	if got := h.Running(); len(got) != 1 {
		t.Fatalf("helpers running = %v; want the one started", got)
	}
	if err := h.Drop(ctx, "berth-1-1"); err != nil {
		t.Fatal(err)
	}
	if got := h.Running(); len(got) != 0 {
		t.Errorf("the helper runs on after its drop: %v", got)
	}

	out, err := exec.Command(bin, "--help").CombinedOutput()
	if err != nil || strings.Contains(string(out), vz.HelperSubcommand) {
		t.Errorf("berth --help lists the hidden %s (or failed: %v):\n%s", vz.HelperSubcommand, err, out)
	}
}
