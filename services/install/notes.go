package install

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/berth-ci/berth/services/config"
)

// configNotes is what an installer should hear about the config it copies
// onto a host before the service reads it there: sections only other
// services read (they may hold the GitHub App's key or the webhook secret),
// paths that name files in the installer's own directory (the service
// runs in workDir), and no NATS credentials at all.
func configNotes(raw []byte, c *config.Config, credsGiven bool, workDir string) []string {
	var notes []string
	var top map[string]any
	_ = yaml.Unmarshal(raw, &top) // config.Parse read it already
	var others []string
	for _, k := range []string{"dispatcher", "watchdog"} {
		if v, ok := top[k]; ok && v != nil {
			others = append(others, k)
		}
	}
	if len(others) > 0 {
		notes = append(notes, fmt.Sprintf("the config also holds %s: an agent reads only nats, data_dir and agents; "+
			"those sections may carry GitHub credentials and the webhook secret, so install a config without them on a host",
			strings.Join(others, " and ")))
	}
	if rel := relativePaths(top["agents"]); len(rel) > 0 {
		notes = append(notes, fmt.Sprintf("the agents' section names %s, relative to this directory; the service runs in %s: "+
			"give absolute paths on the host", strings.Join(rel, ", "), workDir))
	}
	if !credsGiven && c.NATS.CredsFile == "" && c.NATS.NKeyFile == "" {
		notes = append(notes, "no NATS credentials: neither --creds-from nor nats.creds_file nor nats.nkey_file; "+
			"a NATS with authorization (berth nats-auth) refuses the agent: pass --creds-from agent-HOST.nk")
	}
	return notes
}

// relativePaths lists the strings under v that are relative paths to files
// that exist from here (as `deploy/exec/create.sh` from a checkout).
func relativePaths(v any) []string {
	seen := map[string]bool{}
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		case string:
			if strings.Contains(v, "/") && !filepath.IsAbs(v) && !strings.Contains(v, "://") {
				if _, err := os.Stat(v); err == nil {
					seen[v] = true
				}
			}
		}
	}
	walk(v)
	out := make([]string, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}
