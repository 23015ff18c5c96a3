package e2e

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/berth-ci/berth/tests/harness"
)

// Given the Makefile a new user meets first, then `make help` lists every
// target the README names with what it does, and the slow first builds
// (`make demo` cold, `make images`) say what they build and why it takes
// time before they start (make -n prints the commands without running).
func TestMakeSaysWhatItDoes(t *testing.T) {
	mk, err := exec.LookPath("make")
	if err != nil {
		t.Skip("make is not on PATH")
	}
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(mk, append([]string{"-s", "-C", root}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	help := run("help")
	for _, target := range []string{"demo", "test", "help", "images", "build", "tools", "bench", "chaos"} {
		if !strings.Contains(help, "  "+target+": ") {
			t.Errorf("make help does not describe %s:\n%s", target, help)
		}
	}
	if demo := run("-n", "demo"); !strings.Contains(demo, "echo \"building the demo") {
		t.Errorf("make demo builds in silence:\n%s", demo)
	}
	images := run("-n", "images")
	for i := 1; i <= 6; i++ {
		if !strings.Contains(images, "images "+string(rune('0'+i))+"/6: ") {
			t.Errorf("make images does not announce step %d/6:\n%s", i, images)
		}
	}
}
