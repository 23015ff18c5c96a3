package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Given the example file shipped in deploy/, when it is loaded, then it is
// valid and its durations and defaults are what the comments promise.
func TestExampleConfigLoads(t *testing.T) {
	c, err := Load(filepath.Join("..", "..", "deploy", "berth.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Watchdog.ProvisionTimeout != 10*time.Minute || c.Agents[0].PhysicalCap != 2 || c.Agents[0].Pools["macos"].Slots != 2 {
		t.Errorf("unexpected values: %+v", c)
	}
}

// Given a file with several mistakes, when it is parsed, then every mistake
// is reported at once, each saying what to change.
func TestValidateReportsEveryProblem(t *testing.T) {
	_, err := Parse([]byte(`
dispatcher: {github: {scope: enterprise}}
agents:
  - host: "bad.name"
    pools: {linux: {slots: 0}}
    backend: {kind: exec}
  - host: dup
    pools: {a: {labels: [x], slots: 1}}
    backend: {kind: exec, exec: {create: [c], stop: [s]}}
  - host: dup
    pools: {a: {labels: [x], slots: 1}}
    backend: {kind: exec, exec: {create: [c], stop: [s]}}
`))
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"scope", "bad.name", "slots >= 1", "create and stop", "appears twice"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
}

// Given a secret named by an environment variable, Secret reads it; an
// inline value wins.
func TestSecretFromEnv(t *testing.T) {
	t.Setenv("BERTH_TEST_SECRET", "s3")
	if got := Secret("", "BERTH_TEST_SECRET"); got != "s3" {
		t.Errorf("got %q", got)
	}
	if got := Secret("inline", "BERTH_TEST_SECRET"); got != "inline" {
		t.Errorf("got %q", got)
	}
}

// A missing file says how to fix it.
func TestMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if err == nil || !strings.Contains(err.Error(), "berth.example.yaml") {
		t.Errorf("got %v", err)
	}
	_ = os.Remove
}
