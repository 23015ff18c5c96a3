package ghsim

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// Fixture file names, relative to Config.FixturesDir. These are the real payloads
// documented in shared/fixtures/github/README.md; the simulator only ever reads them.
const (
	fxJITConfig      = "api/runners.generate-jitconfig.201.json"
	fxRunnersList    = "api/runners.list.200.json"
	fxRunnerGet      = "api/runners.get.200.json"
	fxJobGet         = "api/actions.jobs.get.200.json"
	fxRunsList       = "api/actions.runs.list.200.json"
	fxRunJobsList    = "api/actions.runs.jobs.list.200.json"
	fxInstallToken   = "api/apps.installation-token.201.json"
	fxRateLimit      = "api/rate_limit.200.json"
	fxHookQueued     = "webhooks/workflow_job.queued.self-hosted-custom-label.json"
	fxHookInProgress = "webhooks/workflow_job.in_progress.json"
	fxHookSuccess    = "webhooks/workflow_job.completed.success.json"
	fxHookFailure    = "webhooks/workflow_job.completed.failure.json"
	fxHookCancelled  = "webhooks/workflow_job.completed.cancelled.self-hosted-arm64.partial.json"
	fxPrimaryLimit   = "api/error.403.primary-rate-limit.go-github-test.json"
	fxSecondaryLimit = "api/error.403.secondary-rate-limit.recorded.wiremock.json"
)

// fixtures holds every parsed fixture body. The maps are templates: callers must
// deepCopy before modifying them.
type fixtures struct {
	jitConfig, runnersList, runnerGet, jobGet, runsList, runJobsList map[string]any
	installToken, rateLimit                                          map[string]any
	hookQueued, hookInProgress, hookSuccess, hookFailure, hookCancel map[string]any
	primaryLimit                                                     map[string]any // body of a primary rate-limit 403
	secondaryLimit                                                   string         // message of a secondary rate limit
}

// loadFixtures reads and parses all fixture files from dir. It fails if any file
// is missing, is not a JSON object, or lacks the nested object the sim relies on.
func loadFixtures(dir string) (*fixtures, error) {
	if dir == "" {
		return nil, fmt.Errorf("ghsim: Config.FixturesDir is empty")
	}
	fx := &fixtures{}
	targets := []struct {
		name string
		dst  *map[string]any
		need string // top-level key that must hold an object or array
	}{
		{fxJITConfig, &fx.jitConfig, "runner"},
		{fxRunnersList, &fx.runnersList, "runners"},
		{fxRunnerGet, &fx.runnerGet, "labels"},
		{fxJobGet, &fx.jobGet, "steps"},
		{fxRunsList, &fx.runsList, "workflow_runs"},
		{fxRunJobsList, &fx.runJobsList, "jobs"},
		{fxInstallToken, &fx.installToken, "permissions"},
		{fxRateLimit, &fx.rateLimit, "resources"},
		{fxHookQueued, &fx.hookQueued, "workflow_job"},
		{fxHookInProgress, &fx.hookInProgress, "workflow_job"},
		{fxHookSuccess, &fx.hookSuccess, "workflow_job"},
		{fxHookFailure, &fx.hookFailure, "workflow_job"},
		{fxHookCancelled, &fx.hookCancel, "workflow_job"},
	}
	for _, t := range targets {
		path := filepath.Join(dir, filepath.FromSlash(t.name))
		raw, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("ghsim: read fixture: %w", err)
		}
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, fmt.Errorf("ghsim: parse fixture %s: %w", path, err)
		}
		switch m[t.need].(type) {
		case map[string]any, []any:
		default:
			return nil, fmt.Errorf("ghsim: fixture %s has no %q object", path, t.need)
		}
		*t.dst = m
	}
	if len(firstOf(fx.runsList, "workflow_runs")) == 0 || len(firstOf(fx.runJobsList, "jobs")) == 0 ||
		len(firstOf(fx.runnersList, "runners")) == 0 {
		return nil, fmt.Errorf("ghsim: list fixtures must contain at least one element")
	}
	for _, k := range []string{"repository", "organization", "sender"} {
		if _, ok := fx.hookQueued[k].(map[string]any); !ok {
			return nil, fmt.Errorf("ghsim: fixture %s has no %q object", fxHookQueued, k)
		}
	}
	if err := loadLimitFixtures(dir, fx); err != nil {
		return nil, err
	}
	return fx, nil
}

// firstOf returns a deep copy of the first element of the array m[key] (an object),
// or nil when there is none.
func firstOf(m map[string]any, key string) map[string]any {
	arr, _ := m[key].([]any)
	if len(arr) == 0 {
		return nil
	}
	obj, _ := deepCopy(arr[0]).(map[string]any)
	return obj
}

// deepCopy copies a value produced by encoding/json decoding into any.
func deepCopy(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = deepCopy(e)
		}
		return m
	case []any:
		s := make([]any, len(x))
		for i, e := range x {
			s[i] = deepCopy(e)
		}
		return s
	default:
		return v
	}
}

// copyObj deep-copies a fixture object.
func copyObj(m map[string]any) map[string]any {
	return deepCopy(m).(map[string]any)
}

// obj returns m[key] as an object, creating it when absent or of another type.
func obj(m map[string]any, key string) map[string]any {
	if o, ok := m[key].(map[string]any); ok {
		return o
	}
	o := map[string]any{}
	m[key] = o
	return o
}
