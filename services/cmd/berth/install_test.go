package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Given a preview directory with no berth binary under it, when an
// operator runs the preview `berth agent install --help` shows
// (`--root DIR --config-from FILE`), then it succeeds, prints every path
// as it is on this machine (under DIR), notes that the binary must be
// installed on the host, and a second run says "unchanged" rather than
// "wrote".
func TestAgentInstallPreviewAsItsHelpShows(t *testing.T) {
	dir := t.TempDir()
	preview := filepath.Join(dir, "preview")
	cfg := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(cfg, []byte("agents:\n  - host: host-a\n    pools:\n      linux: {labels: [self-hosted, linux], slots: 2}\n"+
		"    backend:\n      exec: {create: [/bin/true], stop: [/bin/true]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(verb ...string) string {
		t.Helper()
		if len(verb) == 0 {
			verb = []string{"install", "--config-from", cfg}
		}
		cmd := root()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append(append([]string{"agent"}, verb...), "--root", preview, "--platform", "linux"))
		if err := cmd.Execute(); err != nil {
			t.Fatalf("berth agent install --root %s: %v\n%s", preview, err, out.String())
		}
		return out.String()
	}
	first := run()
	wrote := 0
	for _, line := range strings.Split(first, "\n") {
		if p, ok := strings.CutPrefix(line, "wrote "); ok {
			wrote++
			if !strings.HasPrefix(p, preview+"/") {
				t.Errorf("%q: the path is not under the preview root", line)
			} else if _, err := os.Stat(p); err != nil {
				t.Errorf("%q: %v", line, err)
			}
		}
	}
	if wrote == 0 || !strings.Contains(first, "note: --binary /usr/local/bin/berth is not under "+preview) {
		t.Fatalf("first preview printed:\n%s\nwant the files written under the root and a note on the binary", first)
	}
	second := run()
	if strings.Contains(second, "wrote ") || strings.Count(second, "unchanged "+preview) != wrote {
		t.Errorf("second preview printed:\n%s\nwant %d unchanged files and nothing written", second, wrote)
	}
	// Uninstall prints what it removed as it is on this machine, too.
	gone := run("uninstall")
	removed := 0
	for _, line := range strings.Split(gone, "\n") {
		if p, ok := strings.CutPrefix(line, "removed "); ok {
			removed++
			if !strings.HasPrefix(p, preview+"/") {
				t.Errorf("uninstall: %q: the path is not under the preview root", line)
			} else if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Errorf("uninstall: %q: still there (%v)", line, err)
			}
		}
	}
	if removed < wrote {
		t.Errorf("uninstall printed:\n%s\nwant at least the %d files install wrote removed", gone, wrote)
	}
	if again := run("uninstall"); !strings.Contains(again, "nothing to remove") {
		t.Errorf("second uninstall printed:\n%s\nwant it to say there was nothing to remove", again)
	}
}
