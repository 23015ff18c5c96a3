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

// Given a host that announces a pool its grant does not name, when an
// operator asks `berth status`, then the host is listed without that pool
// and an OVERCLAIM line gives the admin's command.
func TestStatusShowsAHostsOverclaimWithTheCommand(t *testing.T) {
	ctx, js := newLog(t)
	app := &eventlog.Appender{JS: js, Source: "test"}
	at := time.Now().UTC()
	online := events.HostOnline{Host: "mac-1", Boot: "b", PhysicalCap: 2, At: at, Pools: map[string]events.PoolSlots{
		"macos": {Labels: []string{"macos"}, Slots: 1}, "private": {Labels: []string{"private"}, Slots: 1}}}
	grant := events.HostGranted{Host: "mac-1", At: at, Pools: map[string]events.PoolGrant{"macos": {Labels: []string{"macos"}, Slots: 1}}}
	for _, p := range []events.Payload{online, grant} {
		if _, _, err := app.Append(ctx, app.New(at, p), nil); err != nil {
			t.Fatal(err)
		}
	}
	st, err := cli.FleetStatus(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := cli.PrintStatus(&out, st, false, at); err != nil {
		t.Fatal(err)
	}
	if len(st.Hosts) != 1 || st.Hosts[0].Slots["private"] != 0 || st.Hosts[0].Slots["macos"] != 1 ||
		!strings.Contains(out.String(), "OVERCLAIM mac-1") || !strings.Contains(out.String(), "trust host mac-1") {
		t.Fatalf("hosts %+v, printed:\n%s\nwant mac-1 offered macos only and an OVERCLAIM line with `berth trust host mac-1`", st.Hosts, out.String())
	}
}

// Given a host drained with a reason (`berth drain --reason`), when an
// operator asks plain `berth status`, then the host's row gives the reason,
// as the flag's help promises.
func TestStatusShowsWhyAHostDrains(t *testing.T) {
	st := events.Status{Hosts: []events.HostStatus{
		{Name: "mac-1", State: "draining", DrainReason: "disk replacement"},
		{Name: "mac-2", State: "online"},
	}}
	var out strings.Builder
	if err := cli.PrintStatus(&out, st, false, time.Now()); err != nil {
		t.Fatal(err)
	}
	var row string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(l, "mac-1 ") {
			row = l
		}
	}
	if !strings.Contains(row, "draining") || !strings.Contains(row, "disk replacement") {
		t.Fatalf("status printed:\n%s\nwant mac-1's row to say it drains for disk replacement", out.String())
	}
}
