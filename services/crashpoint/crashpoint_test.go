package crashpoint

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// childEnv makes the test binary, run again as a child, hit a point.
const (
	childPoint = "CRASHPOINT_TEST_POINT"
	childHits  = "CRASHPOINT_TEST_HITS"
)

// TestMain turns the test binary into the child when childPoint is set: it
// hits the point the given number of times, then exits 0.
func TestMain(m *testing.M) {
	if p := os.Getenv(childPoint); p != "" {
		n, _ := strconv.Atoi(os.Getenv(childHits))
		for range n {
			Hit(p)
		}
		os.Stdout.WriteString("survived\n")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// child runs the test binary hitting point n times with BERTH_CRASH_AT=arm
// and reports whether it died by SIGKILL.
func child(t *testing.T, arm, point string, n int) (killed bool, out string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), Env+"="+arm, childPoint+"="+point, childHits+"="+strconv.Itoa(n))
	b, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		ws := exit.Sys().(syscall.WaitStatus)
		return ws.Signaled() && ws.Signal() == syscall.SIGKILL, string(b)
	}
	if err != nil {
		t.Fatalf("run child: %v", err)
	}
	return false, string(b)
}

func TestHitKillsTheProcessAtTheArmedPoint(t *testing.T) {
	for _, tc := range []struct {
		name, arm, point string
		hits             int
		killed           bool
	}{
		{"first hit", AgentAfterCreate, AgentAfterCreate, 1, true},
		{"nth hit", AgentAfterCreate + "@3", AgentAfterCreate, 3, true},
		{"fewer hits than n", AgentAfterCreate + "@3", AgentAfterCreate, 2, false},
		{"another point", DispatcherAfterMint, AgentAfterCreate, 5, false},
		{"unset", "", AgentAfterCreate, 5, false},
		{"bad count arms nothing", AgentAfterCreate + "@zero", AgentAfterCreate, 5, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			killed, out := child(t, tc.arm, tc.point, tc.hits)
			if killed != tc.killed {
				t.Fatalf("BERTH_CRASH_AT=%q, %d hits of %s: killed %v, want %v; output:\n%s", tc.arm, tc.hits, tc.point, killed, tc.killed, out)
			}
			if killed && !strings.Contains(out, "crashpoint: "+tc.point) {
				t.Errorf("the child did not name the point before dying: %q", out)
			}
			if !killed && !strings.Contains(out, "survived") {
				t.Errorf("the child neither died nor finished: %q", out)
			}
		})
	}
}

func TestEveryPointNamesItsService(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range All {
		if seen[p] {
			t.Errorf("%s listed twice", p)
		}
		seen[p] = true
		switch Service(p) {
		case "dispatcher", "agent", "watchdog":
		default:
			t.Errorf("%s: service %q is not a berth service", p, Service(p))
		}
	}
}

// The package doc lists every point, for whoever reads a crash in a log.
func TestTheDocListsEveryPoint(t *testing.T) {
	src, err := os.ReadFile("crashpoint.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range All {
		if !strings.Contains(string(src), "//\t"+p+" ") {
			t.Errorf("the package doc does not list %s", p)
		}
	}
}

// BenchmarkHitUnset is the production cost: one atomic load.
func BenchmarkHitUnset(b *testing.B) {
	Hit("warm-up") // reads the (unset) environment once
	for b.Loop() {
		Hit(AgentAfterCreate)
	}
}
