package watchdog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/crashpoint"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/nats-io/nats.go/jetstream"
)

// Watchdog is the act shell around Decide.
type Watchdog struct {
	Loop   *eventlog.Loop
	log    *eventlog.Appender
	js     jetstream.JetStream
	params Params
	now    func() time.Time
	logger *slog.Logger
	// Retention bounds how long terminal records stay in the fold (law 5).
	Retention time.Duration
	// Metrics, when set, receives the fleet gauges after every decision.
	Metrics *Metrics
	// HeartbeatReplicas replicates the heartbeat bucket like the log
	// (nats.replicas), as the agents create it. 0 means 1.
	HeartbeatReplicas int

	fleet      *events.Fleet
	heartbeats map[string]time.Time
	// heardNew holds what the heartbeat watcher read since the last
	// Decide, which merges it (hbMu guards it). Posting each heartbeat to
	// the loop made every one a Decide: 500 hosts beating each second kept
	// the loop so busy that the watcher fell 30 s behind and the watchdog
	// declared live hosts lost (the bench's 500-host scale run).
	hbMu     sync.Mutex
	heardNew map[string]time.Time
	// unheard is the last time the heartbeat bucket did not answer: no
	// silence before it counts against a host (law 7).
	unheard     time.Time
	watched     atomic.Int64         // when the heartbeat watcher last delivered anything (unix ns)
	pending     map[string]time.Time // condition key → when its fact was appended
	pendingKey  map[string]string    // event id → condition key, until folded
	lastCompact time.Time
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
func New(js jetstream.JetStream, app *eventlog.Appender, p Params, now func() time.Time, logger *slog.Logger) *Watchdog {
	if now == nil {
		now = time.Now
	}
	if logger == nil {
		logger = slog.Default()
	}
	return &Watchdog{Loop: &eventlog.Loop{JS: js, Filters: []string{events.SubjectAll}, Gap: DecideGap}, log: app, js: js, params: p,
		now: now, logger: logger, fleet: events.NewFleet(), heartbeats: map[string]time.Time{}, heardNew: map[string]time.Time{}, pending: map[string]time.Time{}, pendingKey: map[string]string{}}
}

// Run drives the watchdog until ctx ends.
func (w *Watchdog) Run(ctx context.Context) error {
	defer w.wg.Wait()
	kv, err := eventlog.HeartbeatKV(ctx, w.js, w.HeartbeatReplicas, w.logger)
	if err != nil {
		return err
	}
	// Load every heartbeat before the first decision: an empty map would
	// read as "no host ever beat" and lose the whole fleet on a watchdog
	// restart (law 7: missing data is not a fact).
	if err := w.loadHeartbeats(ctx, kv); err != nil {
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
				var hb events.Heartbeat
				if json.Unmarshal(e.Value(), &hb) != nil {
					continue
				}
				w.hbMu.Lock()
				if hb.At.After(w.heardNew[e.Key()]) {
					w.heardNew[e.Key()] = hb.At
				}
				w.hbMu.Unlock()
			}
		}
	}()
	return w.Loop.Run(ctx, w)
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
			at := time.Now()
			w.Loop.Post(ctx, func() { w.unheard = at })
		case failed || time.Since(time.Unix(0, w.watched.Load())) > 3*time.Second:
			// Back after a failure, or the watcher has not even shown this
			// probe's writes (it lags or re-subscribes after an outage):
			// read every heartbeat from the bucket itself.
			recovered := failed
			failed = false
			fresh := map[string]time.Time{}
			if w.readHeartbeats(ctx, kv, fresh) == nil {
				at := time.Now()
				w.Loop.Post(ctx, func() {
					for host, hb := range fresh {
						if hb.After(w.heartbeats[host]) {
							w.heartbeats[host] = hb
						}
					}
					if recovered {
						w.unheard = at
					}
				})
			}
		}
	}
}

// heard is the heartbeats as Decide should judge them: a host's silence
// counts only from the last time the bucket did not answer.
func (w *Watchdog) heard(now time.Time) map[string]time.Time {
	w.hbMu.Lock()
	for host, at := range w.heardNew {
		if at.After(w.heartbeats[host]) {
			w.heartbeats[host] = at
		}
	}
	clear(w.heardNew)
	w.hbMu.Unlock()
	if w.unheard.IsZero() || now.Sub(w.unheard) > w.params.HostTTL {
		return w.heartbeats
	}
	hb := make(map[string]time.Time, len(w.fleet.Hosts))
	for name := range w.fleet.Hosts {
		hb[name] = w.unheard
		if at := w.heartbeats[name]; at.After(w.unheard) {
			hb[name] = at
		}
	}
	return hb
}

func (w *Watchdog) loadHeartbeats(ctx context.Context, kv jetstream.KeyValue) error {
	return w.readHeartbeats(ctx, kv, w.heartbeats)
}

// readHeartbeats reads every heartbeat in the bucket into into.
func (w *Watchdog) readHeartbeats(ctx context.Context, kv jetstream.KeyValue, into map[string]time.Time) error {
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	keys, err := kv.ListKeys(lctx)
	if err != nil {
		return err
	}
	for key := range keys.Keys() {
		e, err := kv.Get(lctx, key)
		if err != nil {
			continue
		}
		var hb events.Heartbeat
		if json.Unmarshal(e.Value(), &hb) == nil {
			into[key] = hb.At
		}
	}
	return nil
}

// Apply implements eventlog.Reactor.
func (w *Watchdog) Apply(d eventlog.Delivered) {
	if d.Err != nil {
		w.logger.Warn("skipping event", "seq", d.Event.Seq, "err", d.Err)
		w.fleet.Skip(d.Event.Seq, d.Event.Subject)
		return
	}
	w.fleet.Apply(d.Event)
	if key, ok := w.pendingKey[d.Event.ID]; ok {
		delete(w.pending, key)
		delete(w.pendingKey, d.Event.ID)
	}
}

// Decide implements eventlog.Reactor. Releases go first (law 2).
func (w *Watchdog) Decide(ctx context.Context) {
	now := w.now()
	plan := Decide(w.fleet, now, w.heard(now), w.params)
	conflicted := map[string]bool{}
	for _, r := range plan.Release {
		if conflicted[r.Pool] {
			continue
		}
		crashpoint.Hit(crashpoint.WatchdogBeforeRelease)
		w.logger.Warn("releasing slot", "attempt", r.Attempt, "pool", r.Pool, "host", r.Host, "reason", r.Reason)
		var expect uint64
		if p := w.fleet.Pools[r.Pool]; p != nil {
			expect = p.LastSeq
		}
		if err := w.append(ctx, now, "", r, &expect); errors.Is(err, eventlog.ErrConflict) {
			conflicted[r.Pool] = true
		} else if err == nil {
			crashpoint.Hit(crashpoint.WatchdogAfterRelease)
		}
	}
	for _, p := range plan.Teardown {
		w.append(ctx, now, "", p, nil)
	}
	for _, p := range plan.Abandon {
		w.logger.Warn("teardown overran its deadline; VM abandoned", "attempt", p.Attempt, "host", p.Host, "after", p.After)
		w.append(ctx, now, "", p, nil)
	}
	// Facts whose ids carry the time are kept from repeating, until the fold
	// shows them, by a key per condition.
	for _, p := range plan.Lost {
		w.logger.Warn("host lost", "host", p.Host, "reason", p.Reason)
		w.append(ctx, now, "lost/"+p.Host, p, nil)
	}
	for _, p := range plan.Cordon {
		w.logger.Error("cordoning host", "host", p.Host, "reason", p.Reason)
		w.append(ctx, now, "cordon/"+p.Host, p, nil)
	}
	for _, p := range plan.Uncordon {
		w.logger.Info("lifting cordon", "host", p.Host, "reason", p.Reason)
		w.append(ctx, now, "cordon/"+p.Host, p, nil)
	}
	for _, p := range plan.Demand {
		w.logger.Warn("demand waiting for a slot", "pool", p.Pool, "jobs", p.Jobs, "oldest_job", p.OldestJobID,
			"waited", p.Waited.Round(time.Second), "reason", p.Reason)
		w.append(ctx, now, "demand/"+p.Pool, p, nil)
	}
	for _, p := range plan.Raise {
		w.logger.Error("alarm", "key", p.Key, "pool", p.Pool, "message", p.Message)
		w.append(ctx, now, "alarm/"+p.Key, p, nil)
	}
	for _, p := range plan.Clear {
		w.append(ctx, now, "alarm/"+p.Key, p, nil)
	}
	w.housekeep(now)
	// Health and gauges from a full status view once a second, not on
	// every batch: the view is O(fleet).
	if now.Sub(w.lastObserve) < time.Second {
		return
	}
	w.lastObserve = now
	st := w.fleet.Status()
	w.Metrics.observe(st)
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
		Pools: pools, Cordons: cordons}
	w.mu.Unlock()
}

// housekeep compacts the fold and expires in-flight marks (law 5).
func (w *Watchdog) housekeep(now time.Time) {
	if now.Sub(w.lastCompact) < time.Minute {
		return
	}
	w.lastCompact = now
	if w.Retention > 0 {
		w.fleet.Compact(now, w.Retention)
	}
	for k, at := range w.pending {
		if now.Sub(at) >= pendingFor {
			delete(w.pending, k)
		}
	}
}

// pendingFor is how long an appended fact is trusted to reach the fold
// before the watchdog appends it again.
const pendingFor = 10 * time.Second

// Health returns the latest health view (safe from any goroutine).
func (w *Watchdog) Health() Health {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.health
}

func (w *Watchdog) append(ctx context.Context, now time.Time, key string, p events.Payload, expect *uint64) error {
	ev := w.log.New(now, p)
	if key == "" {
		key = ev.ID
	}
	if at, ok := w.pending[key]; ok && now.Sub(at) < pendingFor {
		return nil
	}
	seq, _, err := w.log.Append(ctx, ev, expect)
	if err != nil {
		if !errors.Is(err, eventlog.ErrConflict) {
			w.logger.Warn("append failed; will retry", "event", ev.ID, "err", err)
		}
		return err
	}
	w.pending[key] = now
	w.pendingKey[ev.ID] = key
	if expect != nil {
		if r, ok := p.(events.SlotReleased); ok {
			if pl := w.fleet.Pools[r.Pool]; pl != nil && seq > pl.LastSeq {
				pl.LastSeq = seq
			}
		}
	}
	return nil
}

// Read runs fn on the watchdog's loop with its fold and waits for it (up to
// ctx): the safe way to look at the live projection from another goroutine.
func (w *Watchdog) Read(ctx context.Context, fn func(*events.Fleet)) error {
	done := make(chan struct{})
	w.Loop.Post(ctx, func() {
		fn(w.fleet)
		close(done)
	})
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
