package run

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/vmagent/backend"
	"github.com/berth-ci/berth/services/vmagent/backends/exec"
)

// Given the wiring in backends.go, every backend is registered, so a
// config may name any of them on any OS.
func TestEveryBackendIsWired(t *testing.T) {
	if got := backend.Kinds(); !slices.Equal(got, []string{"ec2", "exec", "vz"}) {
		t.Errorf("registered kinds %v, want ec2, exec, vz", got)
	}
}

// Given an agent with an exec section, when its backend is built through
// the registry, then it is the exec backend with the section's commands.
func TestExecIsBuiltFromItsSection(t *testing.T) {
	c, err := config.Parse([]byte(`agents:
  - host: h1
    pools: {linux: {labels: [self-hosted], slots: 1}}
    backend: {exec: {create: [c], stop: [s], assign: [a], stop_timeout: 7s}}
`))
	if err != nil {
		t.Fatal(err)
	}
	ac := c.Agents[0]
	be, err := backend.Build(context.Background(), ac.Backend.Kind, ac.Backend.Settings, c.BackendHost(ac))
	if err != nil {
		t.Fatal(err)
	}
	e, ok := be.(*exec.Backend)
	if !ok || e.Host != "h1" || !e.CanAssign() || e.StopCmd[0] != "s" {
		t.Errorf("built %#v", be)
	}
	if st := ac.Backend.Steps(); st.StopTimeout != 7*time.Second || st.CreateTimeout != backend.DefaultSteps.CreateTimeout {
		t.Errorf("steps %+v: want stop 7s and the default create", st)
	}
}

// Given a vz agent on a machine that is not a Mac, its config is valid
// (it can be checked anywhere) but building it says it needs macOS.
func TestVZOffMacOSSaysItNeedsMacOS(t *testing.T) {
	if runtime.GOOS == "darwin" {
		t.Skip("vz is built here")
	}
	c, err := config.Parse([]byte(`agents:
  - host: mac-1
    pools: {macos: {labels: [self-hosted, macos], slots: 2}}
    backend: {vz: {base_image: /b}}
`))
	if err != nil {
		t.Fatalf("a vz config must be checkable off macOS: %v", err)
	}
	ac := c.Agents[0]
	_, err = backend.Build(context.Background(), ac.Backend.Kind, ac.Backend.Settings, c.BackendHost(ac))
	if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "needs macOS") {
		t.Errorf("got %v, want ErrUnavailable saying it needs macOS", err)
	}
}
