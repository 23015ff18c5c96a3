package dispatch_test

import (
	"testing"

	"github.com/berth-ci/berth/services/dispatch"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The dispatcher's series follow Prometheus naming conventions.
func TestDispatcherMetricsAreLintClean(t *testing.T) {
	reg := prometheus.NewRegistry()
	dispatch.NewMetrics(reg)
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint %s: %s", p.Metric, p.Text)
	}
}
