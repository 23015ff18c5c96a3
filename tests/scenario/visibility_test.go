package scenario

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/cli"
	"github.com/berth-ci/berth/services/config"
)

// Law 6: given one host serving two pools, when an operator tears down the
// linux job's VM while its job still runs (its runner dies; GitHub fails
// the job only later), then its held slot is accounted for by no live
// attempt: after the leak grace the watchdog raises a slot-leak alarm for
// the linux pool only, while the macos pool, busy with a running job, raises
// none; status lists the alarm under linux and the watchdog's /healthz turns
// 503; when the job's completion arrives, the slot goes back and the alarm
// clears.
func TestTheLeakAlarmFiresForOnePoolWhileAnotherPoolIsBusyWithTrackedWork(t *testing.T) {
	w := start(t, func(c *config.Config) {
		c.Agents = []config.Agent{host("host-a", 4, linux(2), macos(2))}
		c.Watchdog.LeakGrace = time.Second
	})
	jl := w.enqueue(linuxLabels, 30*time.Second)
	jm := w.enqueue(macosLabels, 30*time.Second)
	al, am := events.AttemptID(jl, 1), events.AttemptID(jm, 1)
	for _, j := range []int64{jl, jm} {
		w.await("both jobs running", 15*time.Second, w.jobIs(j, "in_progress"))
	}

	w.appendFact(events.AttemptTeardownRequested{AttemptRef: events.AttemptRef{Attempt: al, Pool: "linux", Host: "host-a"},
		Reason: "operator: VM misbehaving"})
	w.awaitFact(events.TypeAttemptStopped, al, 10*time.Second)
	w.await("the linux runner is gone", 5*time.Second, func() bool { return !w.runnerAlive("host-a", al) })

	raised := w.awaitAlarm(events.TypeAlarmRaised, "linux", 6*time.Second)
	if a := raised.Data.(*events.AlarmRaised); a.Key != events.AlarmSlotLeak+"/linux" || !strings.Contains(a.Message, al) {
		t.Errorf("alarm %+v: want key %s/linux naming %s", a, events.AlarmSlotLeak, al)
	}
	w.await("status shows the alarm under linux only", 3*time.Second, func() bool {
		st := w.status()
		l, m := poolStatus(st, "linux"), poolStatus(st, "macos")
		return len(l.Alarms) == 1 && len(m.Alarms) == 0 && m.Held == 1 && len(m.HeldBy) == 1 && m.HeldBy[0].Attempt == am
	})
	w.await("the watchdog's /healthz turns 503", 3*time.Second, func() bool {
		code, _ := w.healthz(w.f.Sys.WatchdogAddr)
		return code == http.StatusServiceUnavailable
	})

	// GitHub eventually fails the job whose runner died.
	w.deliverCompleted(jl, "failure")
	w.awaitAlarm(events.TypeAlarmCleared, "linux", 5*time.Second)
	w.await("the watchdog's /healthz is back to 200", 3*time.Second, func() bool {
		code, _ := w.healthz(w.f.Sys.WatchdogAddr)
		return code == http.StatusOK
	})
	if p := poolStatus(w.status(), "linux"); p.Held != 0 {
		t.Errorf("linux holds %d slots after the completion", p.Held)
	}
	for _, e := range w.facts(events.TypeAlarmRaised, "") {
		if p := e.Data.(*events.AlarmRaised).Pool; p != "linux" {
			t.Errorf("alarm raised for pool %s, which only ran tracked work", p)
		}
	}
	if !w.runnerAlive("host-a", am) || w.job(jm).Status != "in_progress" {
		t.Error("the macos job was disturbed")
	}
}

// Law 6, BL-01: given a fleet with a job running and an abandoned VM, then
// the live status (the dispatcher's fold, and GET /status of the dispatcher
// and the watchdog), `berth status --json` (a replay plus heartbeats), the
// watchdog's /healthz and its metrics all show them: per pool capacity,
// held slots beside the attempts that hold them, running and abandoned
// VMs; per host physical cap, live and abandoned VMs, last heartbeat.
func TestStatusAndHealthzReportHeldSlotsCapacityAndAbandonedVMs(t *testing.T) {
	w := start(t, func(c *config.Config) {
		c.Agents = []config.Agent{host("host-a", 3, linux(2)), host("host-b", 2, linux(1))}
		execOf(&c.Agents[0]).StopTimeout = 400 * time.Millisecond
		c.Watchdog.AbandonedCap = 3
	})
	w.fault("host-a", "stop-hang", "*") // only the short job's VM is stopped during the test
	jLong := w.enqueue(linuxLabels, 20*time.Second)
	jShort := w.enqueue(linuxLabels, 200*time.Millisecond)
	for _, j := range []int64{jLong, jShort} {
		a := events.AttemptID(j, 1)
		if h := w.awaitFact(events.TypeSlotReserved, a, 10*time.Second).Data.(*events.SlotReserved).Host; h != "host-a" {
			t.Fatalf("%s booked on %s; the scenario needs both on host-a (most free slots)", a, h)
		}
	}
	w.await("the long job runs and the short one completed", 15*time.Second, func() bool {
		return w.job(jLong).Status == "in_progress" && w.job(jShort).Status == "completed"
	})
	// Runners are interchangeable (law 8): either attempt may have taken
	// either job; the runner names tell which.
	aLong, aShort := w.job(jLong).RunnerName, w.job(jShort).RunnerName
	bookedFor := w.facts(events.TypeSlotReserved, aLong)[0].Data.(*events.SlotReserved).JobID
	w.awaitFact(events.TypeAttemptAbandoned, aShort, 15*time.Second)

	// problems lists what a status view gets wrong; the services' folds may
	// trail the log by a moment, so it is polled.
	problems := func(st events.Status) []string {
		var out []string
		bad := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
		p := poolStatus(st, "linux")
		if p.Capacity != 3 || p.Held != 1 || p.Running != 1 || p.Provisioning != 0 || p.AbandonedVMs != 1 {
			bad("linux capacity %d held %d running %d provisioning %d abandoned %d; want 3 1 1 0 1",
				p.Capacity, p.Held, p.Running, p.Provisioning, p.AbandonedVMs)
		}
		want := events.HeldSlot{Attempt: aLong, Host: "host-a", Stage: "running", JobID: bookedFor, Bound: jLong}
		if len(p.HeldBy) != 1 || p.HeldBy[0] != want {
			bad("held by %+v, want [%+v]", p.HeldBy, want)
		}
		if len(st.Abandoned) != 1 || st.Abandoned[0].Attempt != aShort || st.Abandoned[0].Step != "stop" || st.Abandoned[0].Host != "host-a" {
			bad("abandoned %+v, want %s at step stop on host-a", st.Abandoned, aShort)
		}
		a, b := hostStatus(st, "host-a"), hostStatus(st, "host-b")
		if a.PhysicalCap != 3 || a.LiveVMs != 2 || a.AbandonedVMs != 1 || a.Held["linux"] != 1 || a.Slots["linux"] != 2 {
			bad("host-a %+v; want cap 3, 2 live VMs, 1 abandoned, linux 1/2 held", a)
		}
		if b.PhysicalCap != 2 || b.LiveVMs != 0 || b.Slots["linux"] != 1 {
			bad("host-b %+v; want cap 2, no VM, 1 linux slot", b)
		}
		return out
	}
	w.awaitNone("the live status shows held slots, capacity and the abandoned VM", 5*time.Second,
		func() []string { return problems(w.status()) })

	for name, addr := range map[string]string{"dispatcher": w.f.Sys.DispatcherAddr, "watchdog": w.f.Sys.WatchdogAddr} {
		w.awaitNone("the "+name+"'s GET /status shows them", 5*time.Second, func() []string { return problems(w.httpStatus(addr)) })
	}

	ctx, cancel := context.WithTimeout(w.ctx, 10*time.Second)
	defer cancel()
	st, err := cli.FleetStatus(ctx, w.js)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems(st) {
		t.Errorf("berth status: %s", p)
	}

	for _, h := range st.Hosts {
		if h.LastHeartbeat == nil || time.Since(*h.LastHeartbeat) > 5*time.Second {
			t.Errorf("berth status: %s last heartbeat %v, want within 5s", h.Name, h.LastHeartbeat)
		}
	}

	w.await("the watchdog's /healthz lists the abandoned VM and the cap", 5*time.Second, func() bool {
		code, body := w.healthz(w.f.Sys.WatchdogAddr)
		detail, _ := body["detail"].(map[string]any)
		return code == http.StatusOK && listsAbandoned(body, aShort) && detail["abandoned_cap"] == float64(3)
	})
	for _, addr := range []string{w.f.Sys.DispatcherAddr, w.f.Sys.AgentAddrs["host-a"], w.f.Sys.AgentAddrs["host-b"]} {
		if code, body := w.healthz(addr); code != http.StatusOK {
			t.Errorf("%s /healthz %d %v", addr, code, body)
		}
	}
	w.await("the watchdog's metrics show held slots, capacity and abandoned VMs", 5*time.Second, func() bool {
		m := w.metrics(w.f.Sys.WatchdogAddr)
		return strings.Contains(m, `berth_pool_slots_held{pool="linux"} 1`) &&
			strings.Contains(m, `berth_pool_slots_capacity{pool="linux"} 3`) &&
			strings.Contains(m, `berth_pool_abandoned_vms{pool="linux"} 1`) &&
			strings.Contains(m, `berth_host_live_vms{host="host-a"} 2`)
	})
}

// awaitAlarm waits for the first alarm fact of a type for a pool.
func (w *world) awaitAlarm(typ, pool string, within time.Duration) events.Event {
	w.t.Helper()
	var found events.Event
	w.await(typ+" for pool "+pool, within, func() bool {
		for _, e := range w.facts(typ, "") {
			p := ""
			switch d := e.Data.(type) {
			case *events.AlarmRaised:
				p = d.Pool
			case *events.AlarmCleared:
				p = d.Pool
			}
			if p == pool {
				found = e
				return true
			}
		}
		return false
	})
	return found
}

// httpStatus reads a service's live status over GET /status.
func (w *world) httpStatus(addr string) events.Status {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/status", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.t.Fatalf("GET %s/status: %v", addr, err)
	}
	defer resp.Body.Close()
	var st events.Status
	if resp.StatusCode != http.StatusOK {
		w.t.Fatalf("GET %s/status: %s", addr, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		w.t.Fatalf("GET %s/status: %v", addr, err)
	}
	return st
}

// metrics scrapes a service's /metrics.
func (w *world) metrics(addr string) string {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(w.ctx, 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.t.Fatalf("GET %s/metrics: %v", addr, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
