package install

// The backends register their config sections from init funcs, as
// services/run wires them in the berth command.
import (
	_ "github.com/berth-ci/berth/services/vmagent/backends/ec2"
	_ "github.com/berth-ci/berth/services/vmagent/backends/exec"
	_ "github.com/berth-ci/berth/services/vmagent/backends/vz"
)
