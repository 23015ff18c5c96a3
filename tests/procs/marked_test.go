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
