package watchdog_test

import (
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/services/watchdog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The watchdog's series follow Prometheus naming conventions (lint-clean),
// and report held slots, capacity and abandoned VMs as the fold has them.
func TestMetricsAreLintCleanAndFollowTheFold(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := watchdog.NewMetrics(reg)
	l := given().at(0, host("h-a")).at(time.Minute, abandon(1, "h-a")...).at(time.Minute, running(2, "h-a")...)
	watchdog.Observe(m, l.f.Status())
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint %s: %s", p.Metric, p.Text)
	}
	want := `
# HELP berth_pool_slots_held Slots held per pool.
# TYPE berth_pool_slots_held gauge
berth_pool_slots_held{pool="linux"} 1
# HELP berth_pool_slots_capacity Slots offered per pool by hosts that are not lost.
# TYPE berth_pool_slots_capacity gauge
berth_pool_slots_capacity{pool="linux"} 2
# HELP berth_host_abandoned_vms Abandoned VMs on the host.
# TYPE berth_host_abandoned_vms gauge
berth_host_abandoned_vms{host="h-a"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "berth_pool_slots_held", "berth_pool_slots_capacity", "berth_host_abandoned_vms"); err != nil {
		t.Error(err)
	}
}
