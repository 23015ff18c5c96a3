package watchdog_test

import (
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
)

// Given a job waiting past the report threshold, the demand report says why
// it waits, judged from the hosts that offer its pool: a free slot on a
// cordoned or draining host, or on a host whose physical capacity live or
// abandoned VMs fill, is not "every slot is held" (BL-01, BL-07, BL-32).
func TestWaitingDemandSaysWhyItWaits(t *testing.T) {
	full := func(l *log) { // h-a: both slots held by running jobs
		l.at(0, placed(1, "h-a")...)
		l.at(0, placed(2, "h-a")...)
	}
	hung := func(l *log) { // h-a (physical cap 2): two completed jobs whose stops overran
		l.at(0, abandon(1, "h-a")...)
		l.at(0, abandon(2, "h-a")...)
	}
	capTwo := &events.HostOnline{Host: "h-a", Boot: "b1", PhysicalCap: 2, CurveKey: "X", Backend: "exec",
		Pools: map[string]events.PoolSlots{"linux": {Labels: linux, Slots: 4}}}
	for _, tc := range []struct {
		name  string
		given func(*log)
		want  string
	}{
		{"slots held", func(l *log) { l.at(0, host("h-a")); full(l) }, "every slot of the pool is held"},
		{"cordoned", func(l *log) {
			l.at(0, host("h-a"), &events.HostCordoned{HostChange: events.HostChange{Host: "h-a", By: "ops", At: t0}})
		}, "cordoned or draining"},
		{"draining", func(l *log) {
			l.at(0, host("h-a"), &events.HostDraining{HostChange: events.HostChange{Host: "h-a", By: "vmagent", At: t0}})
		}, "cordoned or draining"},
		{"no physical room", func(l *log) { l.at(0, capTwo); hung(l) }, "physical room"},
		{"no host", func(l *log) {
			l.at(0, host("h-a"), &events.HostLost{HostChange: events.HostChange{Host: "h-a", At: t0}})
		}, "no online host offers this pool"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := given()
			tc.given(l)
			l.at(time.Second, &events.JobQueued{JobRef: job(99)})
			plan := l.decide(time.Second+params.DemandWaitingAfter+time.Second, nil)
			if len(plan.Demand) != 1 || !strings.Contains(plan.Demand[0].Reason, tc.want) {
				t.Fatalf("demand reports %+v, want one saying %q", plan.Demand, tc.want)
			}
		})
	}
}
