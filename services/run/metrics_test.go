package run

import (
	"testing"

	"github.com/berth-ci/berth/services/eventlog"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The log consumer's metrics follow Prometheus naming conventions, and a
// loop that has not started reports its lag as unknown (-1), not as 0.
func TestLoopMetricsAreLintCleanAndLagIsUnknownBeforeStart(t *testing.T) {
	reg := registry()
	loopMetrics(reg, &eventlog.Loop{})
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric %s: %s", p.Metric, p.Text)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "berth_log_consumer_pending" {
			found = true
			if got := mf.GetMetric()[0].GetGauge().GetValue(); got != -1 {
				t.Errorf("lag before start = %v, want -1 (unknown)", got)
			}
		}
	}
	if !found {
		t.Error("berth_log_consumer_pending not exported")
	}
}
