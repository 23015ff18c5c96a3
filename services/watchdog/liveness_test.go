package watchdog_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/clock"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/services/watchdog"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Law 10: liveness from what the observer itself saw, never from another
// machine's wall clock. Each test runs the real watchdog on real NATS with
// a fake clock of its own, and plays each agent with a fake clock of its
// own that writes heartbeats to the real bucket, as the vmagent does.

const livenessTTL = 30 * time.Second

// The watchdog's clock at its start in these tests.
var w0 = time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)

type agentClock struct {
	host string
	clk  *clock.Fake
}

type livenessRig struct {
	t    *testing.T
	ctx  context.Context
	js   jetstream.JetStream
	kv   jetstream.KeyValue
	fake *clock.Fake // the watchdog's
	w    *watchdog.Watchdog
	reg  *prometheus.Registry
}

// agentAt is an agent whose clock reads the watchdog's start plus offset.
func agentAt(host string, offset time.Duration) *agentClock {
	return &agentClock{host: host, clk: clock.NewFake(w0.Add(offset))}
}

// startWatchdog announces the agents (stamped on their clocks), lets
// before fill the heartbeat bucket, and starts a watchdog at w0.
func startWatchdog(t *testing.T, agents []*agentClock, before func(*livenessRig)) *livenessRig {
	t.Helper()
	js, app := testkit.Log(t, "test")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	kv, err := eventlog.HeartbeatKV(ctx, js, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := &livenessRig{t: t, ctx: ctx, js: js, kv: kv, fake: clock.NewFake(w0), reg: prometheus.NewRegistry()}
	for _, a := range agents {
		at := a.clk.Now()
		online := events.HostOnline{Host: a.host, Boot: "b1", PhysicalCap: 2, CurveKey: "X", Backend: "exec", At: at,
			Pools: map[string]events.PoolSlots{"linux": {Slots: 1, Labels: []string{"linux"}}}}
		if _, _, err := app.Append(ctx, app.New(at, online), nil); err != nil {
			t.Fatal(err)
		}
	}
	if before != nil {
		before(r)
	}
	p := params
	p.HostTTL = livenessTTL
	r.w = watchdog.New(js, app, p, r.fake, slog.New(slog.NewTextHandler(io.Discard, nil)))
	r.w.Metrics = watchdog.NewMetrics(r.reg)
	r.w.Loop.Tick = time.Second
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.w.Run(rctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	testkit.Eventually(t, 20*time.Second, "the watchdog caught up", r.w.Loop.CaughtUp)
	return r
}

// put stores a heartbeat stamped at on its writer's clock.
func (r *livenessRig) put(host string, at time.Time) uint64 {
	r.t.Helper()
	hb, _ := json.Marshal(events.Heartbeat{Host: host, Boot: "b1", At: at.UTC()})
	rev, err := r.kv.Put(r.ctx, host, hb)
	if err != nil {
		r.t.Fatal(err)
	}
	return rev
}

// beat stores one heartbeat of each agent, stamped on its own clock, and
// waits until the watchdog saw them.
func (r *livenessRig) beat(agents ...*agentClock) {
	r.t.Helper()
	for _, a := range agents {
		rev := r.put(a.host, a.clk.Now())
		testkit.Eventually(r.t, 10*time.Second, "the watchdog saw "+a.host+"'s heartbeat", func() bool {
			return watchdog.HeardRevision(r.w, a.host) >= rev
		})
	}
}

// advance moves the watchdog's clock and every given agent's clock by d.
func (r *livenessRig) advance(d time.Duration, agents ...*agentClock) {
	r.fake.Advance(d)
	for _, a := range agents {
		a.clk.Advance(d)
	}
}

// round returns once the watchdog has decided at least once at its
// clock's current time (a posted read runs, then its turn decides, then
// the next posted read runs).
func (r *livenessRig) round() {
	r.t.Helper()
	for i := 0; i < 2; i++ {
		if err := r.w.Read(r.ctx, func(*events.Fleet) {}); err != nil {
			r.t.Fatal(err)
		}
	}
}

// lost is the hosts the log says are lost.
func (r *livenessRig) lost() map[string]bool {
	r.t.Helper()
	f, err := eventlog.Replay(r.ctx, r.js, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[string]bool{}
	for name, h := range f.Hosts {
		if h.State == events.HostStateLost {
			out[name] = true
		}
	}
	return out
}

// requireLost decides at the current time and checks that exactly want
// are lost.
func (r *livenessRig) requireLost(when string, want ...string) {
	r.t.Helper()
	r.round()
	got := r.lost()
	if len(got) != len(want) {
		r.t.Fatalf("%s (watchdog clock +%s): lost %v, want %v", when, r.fake.Now().Sub(w0), got, want)
	}
	for _, h := range want {
		if !got[h] {
			r.t.Fatalf("%s (watchdog clock +%s): lost %v, want %v", when, r.fake.Now().Sub(w0), got, want)
		}
	}
}

// keepBeating runs for d in 5 s steps, every clock moving on, the beating
// agents beating after each step, and no host but wantLost lost after
// each decision.
func (r *livenessRig) keepBeating(d time.Duration, clocks, beating []*agentClock, when string, wantLost ...string) {
	r.t.Helper()
	for step := 5 * time.Second; d > 0; d -= step {
		r.advance(min(step, d), clocks...)
		r.beat(beating...)
		r.requireLost(when, wantLost...)
	}
}

// Given one agent whose clock is 5 min behind the watchdog's and one 5 min
// ahead, when their heartbeats keep changing, then neither is ever lost;
// when they stop, then each is lost one TTL (on the watchdog's clock) after
// the last change the watchdog saw, not a second before; and the skew is
// reported, negative for the agent behind.
func TestAgentsWhoseClocksAreOffAreJudgedOnlyByTheirHeartbeatsChanging(t *testing.T) {
	behind, ahead := agentAt("h-behind", -5*time.Minute), agentAt("h-ahead", 5*time.Minute)
	agents := []*agentClock{behind, ahead}
	r := startWatchdog(t, agents, nil)
	r.beat(agents...)
	r.requireLost("at the start")
	r.keepBeating(2*livenessTTL, agents, agents, "while both beat")

	// The skew: the agent's clock minus the watchdog's, when it saw the change.
	r.advance(time.Second, agents...) // health and gauges follow once a second
	r.requireLost("a second after the last beat")
	want := `
# HELP berth_host_clock_skew_seconds The host agent's clock minus the watchdog's, seen when its heartbeat changes (negative: the agent is behind). Reported, never acted on.
# TYPE berth_host_clock_skew_seconds gauge
berth_host_clock_skew_seconds{host="h-ahead"} 300
berth_host_clock_skew_seconds{host="h-behind"} -300
`
	if err := testutil.GatherAndCompare(r.reg, strings.NewReader(want), events.MetricHostClockSkewSeconds); err != nil {
		t.Error(err)
	}
	skews := map[string]float64{}
	for _, h := range r.w.Health().Hosts {
		if h.ClockSkewSeconds != nil {
			skews[h.Host] = *h.ClockSkewSeconds
		}
	}
	if math.Abs(skews["h-behind"]+300) > 1 || math.Abs(skews["h-ahead"]-300) > 1 {
		t.Errorf("/healthz skews %v, want h-behind about -300 and h-ahead about +300", skews)
	}

	// Then the heartbeats stop: one TTL after the last change seen, not
	// before, both are lost.
	r.advance(livenessTTL-time.Second, agents...)
	r.requireLost("exactly one TTL after the last change seen")
	r.advance(time.Second, agents...)
	testkit.Eventually(t, 10*time.Second, "both hosts lost just past one TTL of silence", func() bool {
		l := r.lost()
		return l["h-behind"] && l["h-ahead"]
	})
}

// Given hosts beating, when the watchdog's clock jumps an hour forward (a
// clock step, or a watchdog that stood still), then no host is lost for
// the jump: a gap of more than a TTL between two of its rounds restarts
// its grace, and only a host that does not beat within a TTL of the jump,
// as seen after it, is lost.
func TestAForwardJumpOfTheWatchdogsClockLosesOnlyHostsSilentAfterIt(t *testing.T) {
	a, b := agentAt("h-a", 0), agentAt("h-b", 0)
	agents := []*agentClock{a, b}
	r := startWatchdog(t, agents, nil)
	r.beat(agents...)
	r.keepBeating(2*livenessTTL, agents, agents, "before the jump")

	r.fake.Advance(time.Hour) // the agents' clocks do not jump
	r.requireLost("right after the watchdog's clock jumped an hour")
	r.keepBeating(livenessTTL, agents, []*agentClock{a}, "within a TTL of the jump, h-b silent")
	r.advance(time.Second, agents...)
	r.beat(a)
	r.requireLost("a TTL after the jump, h-b silent since before it", "h-b")
}

// Given a host beating, when its agent's clock jumps an hour forward, then
// nothing changes: it stays alive while its heartbeat changes, and is lost
// one TTL after the last change, not an hour later.
func TestAForwardJumpOfTheAgentsClockChangesNothing(t *testing.T) {
	a := agentAt("h-a", 0)
	r := startWatchdog(t, []*agentClock{a}, nil)
	r.beat(a)
	r.keepBeating(2*livenessTTL, []*agentClock{a}, []*agentClock{a}, "before the agent's jump")
	a.clk.Advance(time.Hour)
	r.keepBeating(2*livenessTTL, []*agentClock{a}, []*agentClock{a}, "after the agent's clock jumped an hour")
	r.advance(livenessTTL, a)
	r.requireLost("one TTL after its last heartbeat")
	r.advance(time.Second, a)
	r.requireLost("just past one TTL after its last heartbeat", "h-a")
}

// Given a bucket whose heartbeats were written two hours ago (the watchdog
// was down that long), when the watchdog starts, then no host is lost
// during its first TTL, whatever the bucket says; a host that beats stays
// alive; and a host whose heartbeat never changes is lost once the grace
// is over (an old value in the bucket keeps nobody alive).
func TestAWatchdogRestartedAfterALongOutageWaitsOneTTLThenJudgesWhatChanged(t *testing.T) {
	alive, dead := agentAt("h-alive", -2*time.Hour), agentAt("h-dead", -2*time.Hour)
	agents := []*agentClock{alive, dead}
	r := startWatchdog(t, agents, func(r *livenessRig) {
		for _, a := range agents {
			r.put(a.host, a.clk.Now())
		}
		for _, a := range agents {
			a.clk.Advance(2 * time.Hour) // back to now: they kept running while the watchdog was down
		}
	})
	r.requireLost("as the watchdog starts")
	r.keepBeating(livenessTTL, agents, []*agentClock{alive}, "during the grace")
	r.advance(time.Second, agents...)
	r.beat(alive)
	r.requireLost("past the grace", "h-dead")
}
