package cli_test

import (
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/cli"
	"github.com/berth-ci/berth/services/eventlog"
)

// Given an agent whose clock is 5 min behind, when an operator asks
// `berth status --json`, then its host shows a clock skew of about -300 s
// (the agent's clock minus the NATS server's when it stored the heartbeat),
// beside its last heartbeat as the agent wrote it.
func TestStatusReportsAnAgentsClockSkew(t *testing.T) {
	ctx, js := newLog(t)
	app := &eventlog.Appender{JS: js, Source: "test"}
	behind := time.Now().Add(-5 * time.Minute).UTC()
	if _, _, err := app.Append(ctx, app.New(behind, events.HostOnline{Host: "mac-1", Boot: "b", PhysicalCap: 2, At: behind}), nil); err != nil {
		t.Fatal(err)
	}
	kv, err := eventlog.HeartbeatKV(ctx, js, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	hb, _ := json.Marshal(events.Heartbeat{Host: "mac-1", Boot: "b", At: behind})
	if _, err := kv.Put(ctx, "mac-1", hb); err != nil {
		t.Fatal(err)
	}
	st, err := cli.FleetStatus(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Hosts) != 1 || st.Hosts[0].ClockSkewSeconds == nil || st.Hosts[0].LastHeartbeat == nil {
		t.Fatalf("hosts %+v, want mac-1 with its last heartbeat and clock skew", st.Hosts)
	}
	if s := *st.Hosts[0].ClockSkewSeconds; math.Abs(s+300) > 5 {
		t.Errorf("clock skew %.1f s, want about -300", s)
	}
}
