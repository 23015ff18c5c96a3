package events_test

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
)

// pinned is every constant of the contract with its value as the README,
// docs/, deploy/ (NATS permissions, Grafana) and operators know it. A
// change here is a change to an external contract: do it on purpose, with
// its readers.
var pinned = []struct{ name, got, want string }{
	{"StreamName", events.StreamName, "BERTH_EVENTS"},
	{"SubjectPrefix", events.SubjectPrefix, "berth.evt"},
	{"SubjectAll", events.SubjectAll, "berth.evt.>"},

	{"BucketSnapshots", events.BucketSnapshots, "berth_snapshots"},
	{"BucketHeartbeats", events.BucketHeartbeats, "berth_heartbeats"},
	{"BucketParked", events.BucketParked, "berth_parked"},
	{"BucketTrust", events.BucketTrust, "berth_trust"},
	{"BucketScaleSets", events.BucketScaleSets, "berth_scalesets"},

	{"SnapshotKeyDispatcher", events.SnapshotKeyDispatcher, "dispatcher"},
	{"SnapshotKeyWatchdog", events.SnapshotKeyWatchdog, "watchdog"},
	{"HeartbeatProbeKey", events.HeartbeatProbeKey, "watchdog.probe"},

	{"MetricPoolSlotsHeld", events.MetricPoolSlotsHeld, "berth_pool_slots_held"},
	{"MetricPoolSlotsCapacity", events.MetricPoolSlotsCapacity, "berth_pool_slots_capacity"},

	{"MetricWebhooksTotal", events.MetricWebhooksTotal, "berth_webhooks_total"},
	{"MetricEventsSkippedTotal", events.MetricEventsSkippedTotal, "berth_events_skipped_total"},
	{"MetricPoolJobsQueued", events.MetricPoolJobsQueued, "berth_pool_jobs_queued"},
	{"MetricJITMintSeconds", events.MetricJITMintSeconds, "berth_jit_mint_seconds"},
	{"MetricGitHubAPIRemaining", events.MetricGitHubAPIRemaining, "berth_github_api_remaining"},
	{"MetricGitHubAPIBlockedSeconds", events.MetricGitHubAPIBlockedSeconds, "berth_github_api_blocked_seconds"},
	{"MetricJobConflictsTotal", events.MetricJobConflictsTotal, "berth_job_conflicts_total"},
	{"MetricJobQueueSeconds", events.MetricJobQueueSeconds, "berth_job_queue_seconds"},
	{"MetricRunnerOnlineSeconds", events.MetricRunnerOnlineSeconds, "berth_runner_online_seconds"},
	{"MetricPoolWarmVMs", events.MetricPoolWarmVMs, "berth_pool_warm_vms"},
	{"MetricPoolWarmTarget", events.MetricPoolWarmTarget, "berth_pool_warm_target"},
	{"MetricPoolWarmRefillLagSeconds", events.MetricPoolWarmRefillLagSeconds, "berth_pool_warm_refill_lag_seconds"},

	{"MetricPoolAttemptsRunning", events.MetricPoolAttemptsRunning, "berth_pool_attempts_running"},
	{"MetricPoolAttemptsProvisioning", events.MetricPoolAttemptsProvisioning, "berth_pool_attempts_provisioning"},
	{"MetricPoolJobsWaitingForSlot", events.MetricPoolJobsWaitingForSlot, "berth_pool_jobs_waiting_for_slot"},
	{"MetricPoolAbandonedVMs", events.MetricPoolAbandonedVMs, "berth_pool_abandoned_vms"},
	{"MetricPoolAlarmsActive", events.MetricPoolAlarmsActive, "berth_pool_alarms_active"},
	{"MetricHostLiveVMs", events.MetricHostLiveVMs, "berth_host_live_vms"},
	{"MetricHostAbandonedVMs", events.MetricHostAbandonedVMs, "berth_host_abandoned_vms"},
	{"MetricHostPhysicalCap", events.MetricHostPhysicalCap, "berth_host_physical_cap"},
	{"MetricHostCordoned", events.MetricHostCordoned, "berth_host_cordoned"},
	{"MetricHostClockSkewSeconds", events.MetricHostClockSkewSeconds, "berth_host_clock_skew_seconds"},

	{"MetricLogRedeliveredTotal", events.MetricLogRedeliveredTotal, "berth_log_redelivered_total"},
	{"MetricLogConsumerRecreatedTotal", events.MetricLogConsumerRecreatedTotal, "berth_log_consumer_recreated_total"},
	{"MetricLogReactionPanicsTotal", events.MetricLogReactionPanicsTotal, "berth_log_reaction_panics_total"},
	{"MetricLogConsumerPending", events.MetricLogConsumerPending, "berth_log_consumer_pending"},
	{"MetricLogParkedTotal", events.MetricLogParkedTotal, "berth_log_parked_total"},
	{"MetricLogRefusedTotal", events.MetricLogRefusedTotal, "berth_log_refused_total"},
	{"MetricRunnersSweptTotal", events.MetricRunnersSweptTotal, "berth_runners_swept_total"},
	{"MetricLogDuplicateMismatchTotal", events.MetricLogDuplicateMismatchTotal, "berth_log_duplicate_mismatch_total"},
	{"MetricAgentBackendStepSeconds", events.MetricAgentBackendStepSeconds, "berth_agent_backend_step_seconds"},
}

func TestContractValuesArePinned(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range pinned {
		seen[p.name] = true
		if p.got != p.want {
			t.Errorf("events.%s = %q, want %q: it is an external contract (README, docs, deploy, NATS permissions, dashboards)", p.name, p.got, p.want)
		}
	}
	// Every constant contract.go declares is pinned above, so a new one
	// cannot go unpinned.
	for _, name := range contractConsts(t) {
		if !seen[name] {
			t.Errorf("events.%s is declared in contract.go but not pinned in contract_test.go", name)
		}
		delete(seen, name)
	}
	for name := range seen {
		t.Errorf("events.%s is pinned but contract.go does not declare it", name)
	}

	keys := []struct{ got, want string }{
		{events.SnapshotKeyAgent("mac-1"), "agent-mac-1"},
		{events.SnapshotPartKey("dispatcher", 42, 3), "dispatcher.g42.3"},
		{events.SnapshotParts("agent-mac-1"), "agent-mac-1.>"},
		{events.ParkedKey("berth-watchdog-a-1", 7), "berth-watchdog-a-1.7"},
		{events.JobSubject(12), "berth.evt.job.12"},
		{events.PoolSubject("macos"), "berth.evt.pool.macos"},
		{events.AttemptSubject("mac-1", "berth-12-1"), "berth.evt.attempt.mac-1.berth-12-1"},
		{events.HostAttemptsFilter("mac-1"), "berth.evt.attempt.mac-1.>"},
		{events.HostSubject("mac-1"), "berth.evt.host.mac-1"},
		{events.DemandSubject("macos"), "berth.evt.demand.macos"},
		{events.AlarmSubject("macos"), "berth.evt.alarm.macos"},
	}
	for _, k := range keys {
		if k.got != k.want {
			t.Errorf("got %q, want %q", k.got, k.want)
		}
	}
}

// The heartbeat's JSON is read by the watchdog and `berth status`, maybe
// of another build than the agent that wrote it.
func TestHeartbeatJSONShapeIsPinned(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	b, err := json.Marshal(events.Heartbeat{Host: "mac-1", Boot: "b1", At: at, LiveVMs: 2})
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"host":"mac-1","boot":"b1","at":"2026-01-02T03:04:05Z","live_vms":2}`
	if string(b) != want {
		t.Errorf("heartbeat JSON %s, want %s", b, want)
	}
}

// contractConsts lists the constants contract.go declares.
func contractConsts(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "contract.go", nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range f.Decls {
		if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.CONST {
			for _, s := range g.Specs {
				for _, n := range s.(*ast.ValueSpec).Names {
					names = append(names, n.Name)
				}
			}
		}
	}
	return names
}

// contractLiteral reports whether a Go string literal's value spells a
// contract name that only contract.go may spell: a KV bucket or metric
// name (berth_…, also inside a KV stream or subject name), the stream's
// name, or a subject under the prefix.
func contractLiteral(s string) bool {
	return strings.HasPrefix(s, "berth_") || s == events.StreamName ||
		strings.Contains(s, "KV_berth_") || strings.Contains(s, "$KV.berth_") ||
		strings.HasPrefix(s, events.SubjectPrefix+".")
}

// contractLiterals returns file:line of every string literal in src that
// spells a contract name.
func contractLiterals(fset *token.FileSet, name string, src any) ([]string, error) {
	f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		lit, ok := n.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return true
		}
		if s, err := strconv.Unquote(lit.Value); err == nil && contractLiteral(s) {
			p := fset.Position(lit.Pos())
			out = append(out, p.Filename+":"+strconv.Itoa(p.Line)+": "+lit.Value)
		}
		return true
	})
	return out, nil
}

// The scan finds what it must, and lets prose and event types be.
func TestContractLiteralScanSeesSpelledNames(t *testing.T) {
	const src = `package x
const a = "berth_heartbeats"
var b = []string{"KV_berth_parked", "$JS.API.DIRECT.GET.KV_berth_snapshots.$KV.berth_snapshots.x"}
func f() { g("BERTH_EVENTS", ` + "`berth_pool_slots_held`" + `, "berth.evt.job.>") }
const ok1, ok2 = "berth.job.queued.v1", "keep snapshots (berth_snapshots) to avoid this"
`
	got, err := contractLiterals(token.NewFileSet(), "x.go", src)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`x.go:2: "berth_heartbeats"`, `x.go:3: "KV_berth_parked"`,
		`x.go:3: "$JS.API.DIRECT.GET.KV_berth_snapshots.$KV.berth_snapshots.x"`,
		`x.go:4: "BERTH_EVENTS"`, "x.go:4: `berth_pool_slots_held`", `x.go:4: "berth.evt.job.>"`}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("scan found\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// Production code in events/ and services/ names the stream, the KV
// buckets, subjects and metrics through contract.go, never by spelling
// them: a rename then changes one file, and a grep for a name finds its
// one declaration. (Prose that mentions a name, such as help text, is
// allowed: the scan flags literals that are the name, not ones that
// mention it mid-sentence.)
func TestProductionCodeSpellsNoContractName(t *testing.T) {
	root := ".."
	if _, err := os.Stat(filepath.Join(root, "services", "go.mod")); err != nil {
		t.Skip("services/ is not beside events/ (the module is used alone)")
	}
	fset := token.NewFileSet()
	var found []string
	for _, dir := range []string{"events", "services"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if n := d.Name(); n == "testdata" || n == "vendor" || (strings.HasPrefix(n, ".") && n != "..") {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") ||
				path == filepath.Join(root, "events", "contract.go") {
				return nil
			}
			lits, err := contractLiterals(fset, path, nil)
			if err != nil {
				return err
			}
			found = append(found, lits...)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	sort.Strings(found)
	for _, f := range found {
		t.Errorf("%s: a contract name spelled outside events/contract.go; use its constant", f)
	}
}
