package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"testing"

	"github.com/berth-ci/berth/services/run"
	"github.com/berth-ci/berth/tests/harness"
)

var seriesName = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)`)

// scrapeNames reads every service's /metrics and returns the series names
// they expose.
func scrapeNames(t *testing.T, ctx context.Context, sys *run.System) map[string]bool {
	t.Helper()
	addrs := []string{sys.DispatcherAddr, sys.WatchdogAddr}
	for _, a := range sys.AgentAddrs {
		addrs = append(addrs, a)
	}
	names := map[string]bool{}
	for _, addr := range addrs {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("scrape %s: %v", addr, err)
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if m := seriesName.FindStringSubmatch(sc.Text()); m != nil {
				names[m[1]] = true
			}
		}
		resp.Body.Close()
	}
	return names
}

// checkDashboard: every series the Grafana dashboard in deploy/grafana
// queries is one the running services expose, so no panel is empty for a
// misspelt or removed name.
func checkDashboard(t *testing.T, ctx context.Context, sys *run.System) {
	t.Helper()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, "deploy", "grafana", "berth.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("deploy/grafana/berth.json: %v", err)
	}
	exposed := scrapeNames(t, ctx, sys)
	used := regexp.MustCompile(`berth_[a-z_]+`)
	var missing []string
	queried := 0
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, tg := range p.Targets {
			for _, name := range used.FindAllString(tg.Expr, -1) {
				queried++
				if !exposed[name] {
					missing = append(missing, fmt.Sprintf("%s (panel %q)", name, p.Title))
				}
			}
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 || queried == 0 {
		t.Errorf("the dashboard queries %d series; not exposed by any service: %v", queried, missing)
	}
}
