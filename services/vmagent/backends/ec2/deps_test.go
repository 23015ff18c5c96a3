package ec2_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The agent reaches EC2 only through the backend interface: neither the
// agent nor the backend interface may depend on the AWS SDK (only this
// package and the wiring in services/run do).
func TestOnlyTheBackendImportsTheAWSSDK(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not on PATH")
	}
	for _, pkg := range []string{"github.com/berth-ci/berth/services/vmagent", "github.com/berth-ci/berth/services/vmagent/backend"} {
		out, err := exec.Command(gobin, "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, "github.com/aws/") {
				t.Errorf("%s depends on %s", pkg, dep)
			}
		}
	}
}
