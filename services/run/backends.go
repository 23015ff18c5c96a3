package run

// The backends an agent can run: each registers its config section and
// constructor with package backend from an init func (vz's constructor
// only on macOS). A new backend is one more line here.
import (
	_ "github.com/berth-ci/berth/services/vmagent/backends/ec2"
	_ "github.com/berth-ci/berth/services/vmagent/backends/exec"
	_ "github.com/berth-ci/berth/services/vmagent/backends/vz"
)
