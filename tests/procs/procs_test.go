package procs

import (
	"os"
	"reflect"
	"testing"
	"time"

	"fmt"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/testkit"
	execbe "github.com/berth-ci/berth/services/vmagent/backends/exec"
	"github.com/berth-ci/berth/tests/harness"
	"go.yaml.in/yaml/v3"
)

// The services read the config the harness builds after a trip through a
// YAML file: every field, durations included, must come back as it was.
func TestConfigSurvivesYAML(t *testing.T) {
	c := harness.Config(harness.Options{DataDir: "/tmp/data"}, "/repo", "/bin/ghsim", "http://127.0.0.1:1", "127.0.0.1:2", "s")
	c.NATS = config.NATS{URL: "nats://127.0.0.1:1,nats://127.0.0.1:2", Replicas: 3, DuplicateWindow: 90 * time.Second}
	c.Watchdog.ProvisionTimeout = 1500 * time.Millisecond
	c.Agents[0].Backend.Settings.(*execbe.Settings).List = []string{"sh", "list"}
	c.Agents[0].InventoryEvery = time.Second
	c.Defaults() // what Parse fills in must not count as a change
	b, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	back, err := config.Parse(b)
	if err != nil {
		t.Fatalf("parse what was marshalled: %v\n%s", err, b)
	}
	again, err := yaml.Marshal(back)
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != string(b) {
		t.Fatalf("the config changed through YAML:\nbefore:\n%s\nafter:\n%s", b, again)
	}
	if back.Watchdog.ProvisionTimeout != 1500*time.Millisecond || back.NATS.Replicas != 3 || !reflect.DeepEqual(back.Agents[0].Backend.Settings.(*execbe.Settings).List, []string{"sh", "list"}) {
		t.Fatalf("fields lost: %+v", back)
	}
}

// Given a process killed with SIGKILL, its state says so, it can be
// restarted, and its output from both runs lands in one file.
func TestAProcessCanBeKilledAndRestarted(t *testing.T) {
	dir := t.TempDir()
	p := newProc("sleeper", dir+"/sleeper.log", dir, nil, "sh", "-c", "echo up; exec sleep 60")
	if err := p.start(nil); err != nil {
		t.Fatal(err)
	}
	awaitLine(t, p.Log, "up", 1)
	p.Kill(t)
	if p.Running() || p.Unexpected() != "" {
		t.Fatalf("after Kill: running %v, unexpected %q", p.Running(), p.Unexpected())
	}
	p.Restart(t, "X=1")
	if !p.Running() {
		t.Fatal("not running after Restart")
	}
	if err := p.start(nil); err == nil {
		t.Fatal("a second start of a running process was not refused")
	}
	awaitLine(t, p.Log, "up", 2)
	p.Kill(t)
	st := p.AwaitExit(t, 5*time.Second)
	if !KilledBySIGKILL(st) {
		t.Fatalf("state %v, want killed by SIGKILL", st)
	}
	b, _ := os.ReadFile(p.Log)
	if got := string(b); len(got) == 0 || countLines(got, "up") != 2 {
		t.Fatalf("log of two runs:\n%s", got)
	}
}

func awaitLine(t *testing.T, path, line string, n int) {
	t.Helper()
	testkit.Eventually(t, 5*time.Second, fmt.Sprintf("%q printed %d times", line, n), func() bool {
		b, _ := os.ReadFile(path)
		return countLines(string(b), line) >= n
	})
}

func countLines(s, line string) int {
	n := 0
	for _, l := range splitLines(s) {
		if l == line {
			n++
		}
	}
	return n
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := range len(s) {
		if s[i] == '\n' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

// TestMain removes the binaries built for these tests when they end (a
// new user found 117 MB left in the temp directory after make test).
func TestMain(m *testing.M) { os.Exit(Main(m)) }
