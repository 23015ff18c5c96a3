package exec

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/berth-ci/berth/services/vmagent/backend"
)

// Kind is the name of the exec backend's section: `backend: {exec: ...}`.
const Kind = "exec"

// Settings is an agent's `backend: {exec: ...}` section: operator commands
// for each lifecycle step (see Backend).
type Settings struct {
	Create []string `yaml:"create"`
	Stop   []string `yaml:"stop"`
	// List, optional, prints the attempt ids of the VMs that exist; it
	// enables the orphan sweep.
	List []string `yaml:"list"`
	// Assign, optional, starts a warm VM's runner with its JIT config; with
	// it the host can keep warm VMs (dispatcher.warm_pools).
	Assign []string          `yaml:"assign"`
	Env    map[string]string `yaml:"env"`
	// Steps bound each step (law 3).
	backend.Steps `yaml:",inline"`
}

func init() {
	backend.Register(backend.Kind{Name: Kind,
		NewSettings: func() backend.Settings { return &Settings{} },
		New:         fromSettings})
}

// Defaults implements backend.Settings: exec has nothing beyond the steps.
func (s *Settings) Defaults(backend.Host) {}

// Validate implements backend.Settings.
func (s *Settings) Validate(at string, _ backend.Host, bad backend.Report) {
	if len(s.Create) == 0 || len(s.Stop) == 0 {
		bad("%s: create and stop commands are required (see deploy/exec/)", at)
	}
	s.Steps.Check(at, bad)
}

// fromSettings builds the backend an exec section describes; the list
// step's attempt files live under the agent's data directory.
func fromSettings(_ context.Context, bs backend.Settings, h backend.Host) (backend.Backend, error) {
	s, ok := bs.(*Settings)
	if !ok {
		return nil, fmt.Errorf("exec backend: settings of type %T", bs)
	}
	be := New(s.Create, s.Stop, s.Env).WithList(s.List, filepath.Join(h.DataDir, "agents", h.Name, "attempts"))
	be.Host, be.AssignCmd = h.Name, s.Assign
	return be, nil
}
