// Package bench is Berth's benchmark suite: it runs the real dispatcher,
// watchdog and vmagents in one process around an embedded NATS JetStream
// server and the GitHub simulator, with an in-process backend whose VMs are
// simulated runner goroutines, and measures each figure of issue 9 beside a
// reference taken in the same run. The scale phase runs the simulator and
// the agents in a second process (world.go), as GitHub and the hosts are
// apart from the control plane in production. tests/cmd/bench drives it
// (`make bench`).
package bench

import (
	"bufio"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"

	"github.com/berth-ci/berth/tests/harness"
)

// Machine describes where a run happened, for BENCHMARKS.md.
type Machine struct {
	Uname  string // uname -srm
	CPU    string // model name from /proc/cpuinfo
	Cores  int
	MemGiB float64
	Go     string
	Commit string // git rev-parse --short HEAD, with "+dirty" for uncommitted changes
}

// LoadAvg is the 1, 5 and 15 minute load averages from /proc/loadavg: other
// work on the machine skews every figure, so each run records it.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// Describe reads the machine, the Go version and the commit of the repo at root.
func Describe(root string) Machine {
	m := Machine{Cores: runtime.NumCPU(), Go: runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH}
	if out, err := exec.Command("uname", "-srm").Output(); err == nil {
		m.Uname = strings.TrimSpace(string(out))
	}
	m.CPU = procField("/proc/cpuinfo", "model name")
	if kb := procField("/proc/meminfo", "MemTotal"); kb != "" {
		if n, err := strconv.ParseFloat(strings.Fields(kb)[0], 64); err == nil {
			m.MemGiB = n / (1 << 20)
		}
	}
	cmd := exec.Command("git", "rev-parse", "--short", "HEAD")
	cmd.Dir = root
	if out, err := cmd.Output(); err == nil {
		m.Commit = strings.TrimSpace(string(out))
		st := exec.Command("git", "status", "--porcelain", "--untracked-files=no")
		st.Dir = root
		if out, err := st.Output(); err == nil && len(strings.TrimSpace(string(out))) > 0 {
			m.Commit += "+dirty"
		}
	}
	return m
}

// procField returns the value of the first "key : value" line of a /proc file.
func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// RepoRoot and FixturesDir are the harness's: the bench lives in the same
// repository and reads the same fixtures.
var (
	RepoRoot    = harness.RepoRoot
	FixturesDir = harness.FixturesDir
)
