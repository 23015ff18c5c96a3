package config

// The backends register their sections from init funcs, as services/run
// wires them in the berth command.
import (
	_ "github.com/berth-ci/berth/services/vmagent/backends/ec2"
	_ "github.com/berth-ci/berth/services/vmagent/backends/exec"
	_ "github.com/berth-ci/berth/services/vmagent/backends/vz"
)
