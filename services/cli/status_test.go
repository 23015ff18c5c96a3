package cli_test

import (
	"encoding/json"
	"math"
	"strings"
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

// Given a pool whose held slots are a warm VM (booked with no job) and a
// job's attempt, when status prints them, then the warm VM says so and no
// line names a "job 0".
func TestStatusNamesAWarmVMsSlotNotJobZero(t *testing.T) {
	st := events.Status{Pools: []events.PoolStatus{{Name: "linux", HeldBy: []events.HeldSlot{
		{Attempt: "warm-1", Host: "h1", Stage: "idle"},
		{Attempt: "berth-7-1", Host: "h1", Stage: "running", JobID: 7, Bound: 7},
	}}}}
	var out strings.Builder
	if err := cli.PrintStatus(&out, st, false, time.Now()); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if strings.Contains(s, "job 0") || !strings.Contains(s, "warm-1 on h1, idle, a warm VM") || !strings.Contains(s, "booked for job 7") {
		t.Fatalf("status printed:\n%s\nwant the warm VM's slot named as such, job 7's booked for it, and no job 0", s)
	}
}
