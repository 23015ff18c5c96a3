package watchdog_test

import (
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/watchdog"
)

// Given a host that announces a pool the admin never granted it, the
// watchdog raises one host_overclaim alarm charged to the host, whose
// message gives the admin's command; once a grant covers the claim, the
// alarm is cleared.
func TestAnOverclaimingHostRaisesAnAlarmUntilGranted(t *testing.T) {
	f := events.NewFleet()
	h := host("h-a")
	h.Pools["private"] = events.PoolSlots{Labels: []string{"private", "self-hosted"}, Slots: 1}
	fold := func(seq uint64, p events.Payload) {
		e := events.New("test", t0, p)
		e.Seq = seq
		f.Apply(e)
	}
	fold(1, h)
	fold(2, &events.HostGranted{Host: "h-a", Pools: map[string]events.PoolGrant{"linux": {Labels: linux, Slots: 2}}})
	now := t0.Add(time.Second)
	p := watchdog.Decide(f, now, map[string]time.Time{"h-a": now}, params)
	if len(p.Raise) != 1 || p.Raise[0].Kind != events.AlarmHostOverclaim || p.Raise[0].Key != "host_overclaim/fleet/h-a" ||
		!strings.Contains(p.Raise[0].Message, "trust host h-a") || !strings.Contains(p.Raise[0].Message, "pool private is not granted") {
		t.Fatalf("raise %+v, want one host_overclaim alarm for h-a naming private and `berth trust host h-a`", p.Raise)
	}
	if c := events.AlarmCulprit(p.Raise[0].Kind); c != events.CulpritHost {
		t.Errorf("culprit %q, want host", c)
	}
	for i := range p.Raise {
		fold(3, &p.Raise[i])
	}
	if again := watchdog.Decide(f, now, map[string]time.Time{"h-a": now}, params); len(again.Raise) != 0 {
		t.Fatalf("raised again: %+v", again.Raise)
	}
	g := events.GrantClaim(*h)
	fold(4, &g)
	p = watchdog.Decide(f, now, map[string]time.Time{"h-a": now}, params)
	if len(p.Clear) != 1 || p.Clear[0].Key != "host_overclaim/fleet/h-a" {
		t.Fatalf("clear %+v, want the host_overclaim alarm cleared once granted", p.Clear)
	}
}
