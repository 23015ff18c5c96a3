package install

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every property list and entitlements file under deploy/ (launchd
// daemons, the signing entitlements, the guest image's daemon) is a
// well-formed XML property list: codesign and launchd refuse anything else,
// and only on a Mac, so the check runs here (issue 20, item 6).
func TestEveryPlistAndEntitlementsFileUnderDeployParses(t *testing.T) {
	var checked []string
	err := filepath.WalkDir(repoFile(t, "deploy"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !(strings.HasSuffix(path, ".plist") || strings.HasSuffix(path, ".entitlements")) {
			return err
		}
		checked = append(checked, path)
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		m, err := parsePlist(b)
		if err != nil {
			t.Errorf("%s is not a well-formed property list: %v (launchd and codesign refuse it)", path, err)
			return nil
		}
		if strings.HasSuffix(path, ".entitlements") && m["com.apple.security.virtualization"] != true {
			t.Errorf("%s does not grant com.apple.security.virtualization; Virtualization.framework refuses the binary", path)
		}
		if strings.HasSuffix(path, ".plist") {
			if label, _ := m["Label"].(string); label == "" {
				t.Errorf("%s has no Label: launchd does not load it", path)
			}
			if args, _ := m["ProgramArguments"].([]any); len(args) == 0 {
				t.Errorf("%s has no ProgramArguments", path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"launchd/berth.entitlements": false, "launchd/ci.berth.agent.plist": false}
	for _, p := range checked {
		for w := range want {
			if strings.HasSuffix(filepath.ToSlash(p), "deploy/"+w) {
				want[w] = true
			}
		}
	}
	for w, seen := range want {
		if !seen {
			t.Errorf("deploy/%s was not checked (walked %v)", w, checked)
		}
	}
}
