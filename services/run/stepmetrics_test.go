package run

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/services/vmagent/backend"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Given an agent's backend whose first create succeeds and second fails,
// when the agent calls them and a stop, then its /metrics counts each
// call by step and outcome, lint-clean, and the calls' own results pass
// through unchanged; a call that overran its deadline, was canceled or
// has no assign step is labelled so.
func TestBackendStepsAreCountedByOutcome(t *testing.T) {
	fake := testkit.NewBackend(t)
	fake.SetBehaviour(testkit.StepCreate, "berth-2-1", testkit.Fail)
	reg := registry()
	be := measure(fake, reg)
	ctx := context.Background()
	if err := be.Create(ctx, backend.VM{Attempt: "berth-1-1"}); err != nil {
		t.Fatal(err)
	}
	if err := be.Create(ctx, backend.VM{Attempt: "berth-2-1"}); err == nil {
		t.Fatal("the failing create succeeded through the wrapper")
	}
	if err := be.Stop(ctx, backend.VM{Attempt: "berth-1-1"}); err != nil {
		t.Fatal(err)
	}
	for labels, n := range map[string]int{`outcome="ok",step="create"`: 1, `outcome="failed",step="create"`: 1} {
		got := countOf(t, reg, labels)
		if got != n {
			t.Errorf("%s: %d calls counted, want %d", labels, got, n)
		}
	}
	if stops := countOf(t, reg, `step="stop"`); stops != 1 {
		t.Errorf("%d stops counted, want 1", stops)
	}
	for err, want := range map[error]string{context.DeadlineExceeded: "deadline", context.Canceled: "canceled",
		backend.ErrNoAssign: "unsupported", errors.New("exit status 1"): "failed"} {
		if got := outcome(fmt.Errorf("step: %w", err)); got != want {
			t.Errorf("outcome(%v) = %s, want %s", err, got, want)
		}
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric %s: %s", p.Metric, p.Text)
	}
}

// countOf sums the _count series of the step histogram, as /metrics
// shows them, whose labels contain labels.
func countOf(t *testing.T, reg *prometheus.Registry, labels string) int {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	n := 0
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if strings.HasPrefix(line, "berth_agent_backend_step_seconds_count{") && strings.Contains(line, labels) {
			v, err := strconv.Atoi(line[strings.LastIndexByte(line, ' ')+1:])
			if err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			n += v
		}
	}
	return n
}

// capable is a backend with every optional capability: it reads its
// runners' output, reports how a stop ended, and takes JIT configs in
// memory.
type capable struct{ *testkit.Backend }

func (capable) RunnerOutput(context.Context, backend.VM) ([]byte, error) {
	return []byte("√ Connected to GitHub"), nil
}
func (c capable) StopReport(ctx context.Context, vm backend.VM) (string, error) {
	return "forced", c.Stop(ctx, vm)
}
func (capable) InMemoryJIT() {}

// Given backends with and without the optional capabilities, when the
// agent's step metrics wrap them, then the agent still finds each
// capability the backend has and none it lacks (the wrapper hid them:
// an agent started by `berth agent` read no runner's output, so never saw
// GitHub refuse a runner's version, and recorded no stop's ending), and a
// reported stop is counted once and says how the VM ended.
func TestTheStepMetricsHideNoCapabilityOfTheBackend(t *testing.T) {
	reg := registry()
	be := measure(capable{testkit.NewBackend(t)}, reg)
	if ro, ok := backend.As[backend.RunnerOutput](be); !ok {
		t.Error("runner output hidden by the wrapper")
	} else if out, err := ro.RunnerOutput(context.Background(), backend.VM{Attempt: "berth-1-1"}); err != nil || !strings.Contains(string(out), "Connected") {
		t.Errorf("runner output through the wrapper: %q, %v", out, err)
	}
	if _, ok := backend.As[backend.InMemoryJIT](be); !ok {
		t.Error("the in-memory JIT config hidden by the wrapper")
	}
	if ended, err := backend.StopEnded(context.Background(), be, backend.VM{Attempt: "berth-1-1"}); err != nil || ended != "forced" {
		t.Errorf("a stop through the wrapper ended %q (%v), want the backend's report %q", ended, err, "forced")
	}
	if stops := countOf(t, reg, `step="stop"`); stops != 1 {
		t.Errorf("%d stops counted, want 1", stops)
	}

	plain := measure(testkit.NewBackend(t), registry())
	_, ro := backend.As[backend.RunnerOutput](plain)
	_, mem := backend.As[backend.InMemoryJIT](plain)
	if ended, err := backend.StopEnded(context.Background(), plain, backend.VM{Attempt: "berth-1-1"}); ro || mem || ended != "" || err != nil {
		t.Errorf("a plain backend through the wrapper: runner output %v, in-memory JIT %v, stop ended %q (%v); want none", ro, mem, ended, err)
	}
}
