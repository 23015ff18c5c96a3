package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/nats-io/nats.go/jetstream"
)

// Progress prints a replay's progress on one line of w.
func Progress(w io.Writer) func(done, total uint64) {
	return func(done, total uint64) {
		fmt.Fprintf(w, "\rreplaying: %d of %d events (%d%%)", done, total, done*100/max(total, 1))
	}
}

// ReplayStatus rebuilds the fleet from the log as of a sequence (0: the
// end) or a time (zero: no limit).
func ReplayStatus(ctx context.Context, js jetstream.JetStream, seq uint64, at time.Time, progress func(done, total uint64)) (events.Status, []events.Violation, error) {
	f, err := eventlog.ReplayTo(ctx, js, seq, at, progress)
	if err != nil {
		return events.Status{}, nil, err
	}
	return f.Status(), f.Check(), nil
}

// Check compares a running service's live projection (GET url/status) with
// a fresh replay of the log up to the same sequence, and returns every
// difference as "path: live X, replay Y".
func Check(ctx context.Context, js jetstream.JetStream, url string, progress func(done, total uint64)) ([]string, uint64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(url, "/")+"/status", nil)
	if err != nil {
		return nil, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("read %s/status: %w (is the service running? pass its address)", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, 0, fmt.Errorf("%s/status answered %s", url, resp.Status)
	}
	var live events.Status
	if err := json.NewDecoder(resp.Body).Decode(&live); err != nil {
		return nil, 0, fmt.Errorf("decode %s/status: %w", url, err)
	}
	replayed, _, err := ReplayStatus(ctx, js, live.AsOfSeq, time.Time{}, progress)
	if err != nil {
		return nil, 0, err
	}
	return diff("", toTree(live), toTree(replayed)), live.AsOfSeq, nil
}

func toTree(st events.Status) any {
	b, _ := json.Marshal(st)
	var v any
	_ = json.Unmarshal(b, &v)
	return v
}

// diff lists where two JSON trees differ; lists of named items (pools,
// hosts, alarms) are matched by name or key.
func diff(path string, a, b any) []string {
	if reflect.DeepEqual(a, b) {
		return nil
	}
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if aok && bok {
		var out []string
		keys := map[string]bool{}
		for k := range am {
			keys[k] = true
		}
		for k := range bm {
			keys[k] = true
		}
		for _, k := range sortedKeys(keys) {
			out = append(out, diff(path+"."+k, am[k], bm[k])...)
		}
		return out
	}
	al, aok := a.([]any)
	bl, bok := b.([]any)
	if aok && bok {
		an, bn := byName(al), byName(bl)
		if an != nil && bn != nil {
			keys := map[string]bool{}
			for k := range an {
				keys[k] = true
			}
			for k := range bn {
				keys[k] = true
			}
			var out []string
			for _, k := range sortedKeys(keys) {
				out = append(out, diff(path+"["+k+"]", an[k], bn[k])...)
			}
			return out
		}
	}
	la, _ := json.Marshal(a)
	lb, _ := json.Marshal(b)
	return []string{fmt.Sprintf("%s: live %s, replay %s", strings.TrimPrefix(path, "."), la, lb)}
}

func byName(l []any) map[string]any {
	out := map[string]any{}
	for _, v := range l {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		var name string
		for _, k := range []string{"name", "key", "attempt"} {
			if s, ok := m[k].(string); ok {
				name = s
				break
			}
		}
		if name == "" {
			return nil
		}
		out[name] = v
	}
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
