package watchdog

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/clock"
	"github.com/berth-ci/berth/services/crashpoint"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/nats-io/nats.go/jetstream"
)

// Watchdog is the act shell around Decide.
type Watchdog struct {
	*eventlog.Shell
	js     jetstream.JetStream
	params Params
	logger *slog.Logger
	// Retention bounds how long terminal records stay in the fold (law 5).
	Retention time.Duration
	// Metrics, when set, receives the fleet gauges after every decision.
	Metrics *Metrics
	// HeartbeatReplicas replicates the heartbeat bucket like the log
	// (nats.replicas), as the agents create it. 0 means 1.
	HeartbeatReplicas int

	// Liveness (liveness.go): what this watchdog itself saw of each host's
	// heartbeat, on its own clock. beats is written by the heartbeat
	// watcher and the re-reads (hbMu guards it; posting each heartbeat to
	// the loop made every one a Decide: 500 hosts beating each second kept
	// the loop so busy that the watcher fell 30 s behind and the watchdog
	// declared live hosts lost, the bench's 500-host scale run). The rest
	// is the loop's.
	hbMu      sync.Mutex
	beats     map[string]beat
	announced map[string]announcement
	// floor: no silence before it counts against a host. It is the
	// watchdog's start, the last time the heartbeat bucket did not answer,
	// and a jump of its own clock (law 7).
	floor       time.Time
	lastRound   time.Time
	watched     atomic.Int64 // when the heartbeat watcher last delivered anything (unix ns, this process's clock)
	lastCompact time.Time
	refusal     Refusal // facts refused since start (law 10), for the alarm
	// Judgments of absence held until the fold covers the log (view.go):
	// where the log ended when last read, and when each held one was
	// first made. The loop's alone.
	mark        logMark
	judged      map[string]time.Time
	lastObserve time.Time
	mu          sync.Mutex
	health      Health
	wg          sync.WaitGroup
}

// Health is what /healthz reports for the watchdog.
type Health struct {
	Alarms    []events.AlarmView   `json:"alarms"`
	Abandoned []events.AbandonedVM `json:"abandoned_vms"`
	Pools     []PoolHealth         `json:"pools"`
	Cordons   []Cordon             `json:"cordons"`
	Waiting   int                  `json:"jobs_waiting_for_slot"`
	CaughtUp  bool                 `json:"caught_up"`
	Hosts     []HostLiveness       `json:"hosts"`
}

// PoolHealth is one pool's capacity line in /healthz.
type PoolHealth struct {
	Name     string `json:"name"`
	Capacity int    `json:"capacity"`
	Held     int    `json:"held"`
	Running  int    `json:"running"`
	Waiting  int    `json:"jobs_waiting_for_slot"`
}

// Cordon is one cordoned host and why.
type Cordon struct {
	Host   string `json:"host"`
	Reason string `json:"reason"`
	By     string `json:"by"`
}

// DecideGap is the least time between two of the watchdog's Decides that
// new facts trigger (eventlog.Loop.Gap). Its every decision is a deadline
// of seconds, so under a burst of facts it decides at most this often
// instead of walking the live fleet for each one.
const DecideGap = 200 * time.Millisecond

// New builds a watchdog.
// Its deadlines follow clk (nil: the wall clock), loop ticks included, so
// a test drives them with a clock.Fake.
func New(js jetstream.JetStream, app *eventlog.Appender, p Params, clk clock.Clock, logger *slog.Logger) *Watchdog {
	if logger == nil {
		logger = slog.Default()
	}
	loop := &eventlog.Loop{JS: js, Filters: []string{events.SubjectAll}, Gap: DecideGap}
	w := &Watchdog{Shell: eventlog.NewShell(loop, app, clk, logger), js: js, params: p,
		logger: logger, beats: map[string]beat{}, announced: map[string]announcement{}}
	// Only the dispatcher asks GitHub to redeliver a webhook: this fold
	// need not keep the delivery ids (16 bytes a webhook for three days).
	w.Fold.DropDeliveryIDs()
	// Nor the sealed JIT configs: only the agent creating a VM opens one.
	w.Fold.DropSealedJIT()
	w.Refused = func(e events.Event, err error) {
		w.refusal = Refusal{Count: w.refusal.Count + 1, Seq: e.Seq, Subject: e.Subject, Reason: err.Error()}
	}
	w.Crash = map[string][2]string{
		events.TypeSlotReleased: {crashpoint.WatchdogBeforeRelease, crashpoint.WatchdogAfterRelease},
	}
	return w
}

// Run drives the watchdog until ctx ends.
func (w *Watchdog) Run(ctx context.Context) error {
	defer w.wg.Wait()
	kv, err := eventlog.HeartbeatKV(ctx, w.js, w.HeartbeatReplicas, w.logger)
	if err != nil {
		return err
	}
	// Every start waits one host TTL before it judges any host lost,
	// whatever the bucket holds: a value read now says nothing about when
	// it was written on this watchdog's clock (law 10), and the watchdog
	// has not watched anyone yet (law 7). Read every heartbeat before the
	// first decision all the same, so that one that does not change during
	// the grace is known as such.
	w.floor = w.Now()
	if err := w.firstRead(ctx, kv); err != nil {
		return fmt.Errorf("read heartbeats before judging hosts: %w", err)
	}
	w.wg.Add(1)
	go w.probeHeartbeats(ctx, kv)
	watcher, err := kv.WatchAll(ctx)
	if err != nil {
		return err
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer watcher.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-watcher.Updates():
				if !ok {
					return
				}
				if e == nil || e.Operation() != jetstream.KeyValuePut {
					continue
				}
				w.watched.Store(time.Now().UnixNano())
				w.noteBeat(e, true)
			}
		}
	}()
	return w.Loop.Run(ctx, w)
}

// firstRead reads every heartbeat before the first decision, trying again
// with back-off while the bucket does not answer (a NATS node down, its
// replicas electing a leader): NATS's fault is no reason to exit. The
// grace starts again once the read succeeds, since the hosts' heartbeats
// could not be seen before. It fails only when ctx ends.
func (w *Watchdog) firstRead(ctx context.Context, kv jetstream.KeyValue) error {
	wait := 250 * time.Millisecond
	for {
		err := w.readHeartbeats(ctx, kv)
		if err == nil {
			w.raiseFloor(w.Now())
			return nil
		}
		w.logger.Warn("heartbeats not readable yet; no host is judged until they are (is NATS up? berth status shows the stream)",
			"err", err, "retry_in", wait)
		t := w.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C():
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// probeKey is the heartbeat bucket key the watchdog writes to see whether
// the bucket takes writes (no host is named so: host names hold no dot).
const probeKey = events.HeartbeatProbeKey

// probeHeartbeats asks the heartbeat bucket every second whether it
// answers. While it does not (its NATS node is down, its replicas elect a
// leader, the watchdog is cut off), the agents' heartbeats cannot be stored
// or read, so their silence says nothing about the hosts; once it answers
// again every heartbeat is read afresh, since the watcher may lag behind.
func (w *Watchdog) probeHeartbeats(ctx context.Context, kv jetstream.KeyValue) {
	defer w.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	failed := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// A write, as the agents' heartbeats are: a replica that lost its
		// quorum still answers reads.
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := kv.Put(pctx, probeKey, []byte("watchdog probe"))
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			failed = true
			at := w.Now()
			w.Loop.NoteFault(at) // NATS does not take writes: deadlines running now are its (culprit)
			w.Loop.Post(ctx, func() { w.raiseFloor(at) })
		case failed || time.Since(time.Unix(0, w.watched.Load())) > 3*time.Second:
			// Back after a failure, or the watcher has not even shown this
			// probe's writes (it lags or re-subscribes after an outage):
			// read every heartbeat from the bucket itself.
			recovered := failed
			failed = false
			if w.readHeartbeats(ctx, kv) == nil && recovered {
				at := w.Now()
				w.Loop.Post(ctx, func() { w.raiseFloor(at) })
			}
		}
	}
}

// Decide implements eventlog.Reactor: it asks the pure Decide for a plan
// and executes it.
func (w *Watchdog) Decide(ctx context.Context) {
	now := w.Now()
	seen := w.heard(now)
	p := w.params
	p.NATSFaultAt = w.Loop.LastFault()
	plan := Decide(w.Fold, now, seen, p)
	plan.Raise = append(plan.Raise, ForgedAlarm(w.Fold, now, w.refusal)...)
	w.holdUnseen(ctx, &plan, now)
	w.Execute(ctx, plan.Steps(), nil)
	w.housekeep(now)
	// Health and gauges from a full status view once a second, not on
	// every batch: the view is O(fleet).
	if now.Sub(w.lastObserve) < time.Second {
		return
	}
	w.lastObserve = now
	st := w.Fold.StatusCounts()
	hosts := w.liveness(now, seen)
	w.Metrics.observe(st)
	w.Metrics.observeLiveness(hosts)
	waiting := 0
	for _, p := range st.Pools {
		waiting += p.WaitingForSlot
	}
	w.mu.Lock()
	pools := make([]PoolHealth, 0, len(st.Pools))
	for _, p := range st.Pools {
		pools = append(pools, PoolHealth{p.Name, p.Capacity, p.Held, p.Running, p.WaitingForSlot})
	}
	cordons := []Cordon{}
	for _, h := range st.Hosts {
		if h.Cordoned {
			cordons = append(cordons, Cordon{h.Name, h.CordonReason, h.CordonBy})
		}
	}
	w.health = Health{Alarms: st.Alarms, Waiting: waiting, CaughtUp: w.Loop.CaughtUp(), Abandoned: st.Abandoned,
		Pools: pools, Cordons: cordons, Hosts: hosts}
	w.mu.Unlock()
}

// housekeep compacts the fold and expires in-flight marks (law 5), once a
// minute or sooner while the fold grows fast (events.Fleet.CompactDue).
func (w *Watchdog) housekeep(now time.Time) {
	if !w.Fold.CompactDue(now, w.lastCompact) {
		return
	}
	w.lastCompact = now
	if w.Retention > 0 {
		w.Fold.Compact(now, w.Retention)
	}
	w.Housekeep()
}

// Health returns the latest health view (safe from any goroutine).
func (w *Watchdog) Health() Health {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.health
}
