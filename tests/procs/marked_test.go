package procs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Given a service log whose skip is far from its end, when a failed test
// dumps it, then the skip's line is printed, and no other line.
func TestASkippedFactIsFoundAnywhereInTheLog(t *testing.T) {
	var lines []string
	for i := range 500 {
		lines = append(lines, `{"level":"INFO","msg":"appended","seq":`+strings.Repeat("1", i%5+1)+`}`)
	}
	lines[3] = `{"level":"WARN","msg":"skipping event","seq":1707}`
	path := filepath.Join(t.TempDir(), "dispatcher-0.log")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := marked(path, logMarkers, 40); got != lines[3] {
		t.Fatalf("marked lines %q, want only %q", got, lines[3])
	}
	if strings.Contains(tail(path, 60), "skipping") {
		t.Fatal("the test's premise: the skip is not among the last lines")
	}
}

// Given a watchdog's log that refused an agent's stop of an attempt, when a
// failed test looks for what to print, then it names that attempt.
func TestARefusedFactNamesItsAttempt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "watchdog-0.log")
	line := `{"level":"ERROR","msg":"fact refused and parked: the fold skips it","seq":1654,"subject":"berth.evt.attempt.host-a.berth-20019507108-1.agent","type":"berth.attempt.stopped.v1"}`
	if err := os.WriteFile(path, []byte("{\"msg\":\"appended\"}\n"+line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := refusedAttempts([]string{path}); len(got) != 1 || got[0] != "berth-20019507108-1" {
		t.Fatalf("refused attempts %v, want [berth-20019507108-1]", got)
	}
}
