package watchdog

import (
	"context"
	"encoding/json"
	"sort"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/nats-io/nats.go/jetstream"
)

// How the watchdog judges a host alive (law 10: liveness from what the
// observer itself saw, never from another machine's wall clock).
//
// A host is alive while this watchdog keeps seeing its heartbeat change:
// every heartbeat the agent stores is a new revision of its key in the
// heartbeat bucket, and the watchdog notes, on its own clock, when it first
// saw each revision (from its watcher, or from a re-read of the bucket).
// A host is lost once that, or the watchdog seeing the host (re)announce
// itself, is more than the host TTL ago. The time the agent writes in its
// heartbeat is never compared with the watchdog's clock to judge it: an
// agent whose clock is minutes behind or ahead, or that jumps, is judged
// the same as one whose clock is right. That time is only shown, and the
// difference between it and the watchdog's clock when the change is seen
// is reported as the host's clock skew (berth_host_clock_skew_seconds and
// /healthz; positive: the agent's clock is ahead of the watchdog's).
//
// Silence counts only while the watchdog watched. No silence before its
// floor counts: the floor is the watchdog's start (every start waits one
// TTL before it judges any host, whatever the bucket holds, and after that
// TTL a host whose heartbeat did not change is lost), the last time the
// bucket did not answer, and the last round whose clock read earlier than
// the round before it or more than a TTL after it (the watchdog's clock
// was stepped, or the process stood still: its own gap is not the hosts'
// silence, so the grace starts again). On the wall clock the rounds are
// measured on Go's monotonic clock, so a step of the wall clock does not
// show; a fake clock's Advance, a pause or a suspend does.

// beat is one host's heartbeat as this watchdog last saw it change.
type beat struct {
	rev  uint64    // the bucket revision last seen
	at   time.Time // the time the agent wrote in it (its clock: display and skew only)
	seen time.Time // when this watchdog first saw rev (its clock)
	// skew is at - seen for the last change the watcher delivered live;
	// a read at start or after a lag sees old values and says nothing.
	skew      time.Duration
	skewKnown bool
}

// announcement is the host's online advertisement the fold holds, and
// when this watchdog first saw it there.
type announcement struct {
	boot string
	at   time.Time
	seen time.Time
}

// noteBeat records a heartbeat entry read from the bucket. live: delivered
// by the watcher as it was stored (a skew measure), not read back later.
func (w *Watchdog) noteBeat(e jetstream.KeyValueEntry, live bool) {
	if e.Key() == probeKey {
		return
	}
	var hb events.Heartbeat
	if json.Unmarshal(e.Value(), &hb) != nil {
		return
	}
	now := w.Now()
	w.hbMu.Lock()
	defer w.hbMu.Unlock()
	b, ok := w.beats[e.Key()]
	if ok && b.rev == e.Revision() {
		return // the same value again (the watcher's first delivery, a re-read): no change
	}
	b.rev, b.at, b.seen = e.Revision(), hb.At, now
	if live {
		b.skew, b.skewKnown = hb.At.Sub(now), true
	}
	w.beats[e.Key()] = b
}

// readHeartbeats reads every heartbeat in the bucket; a revision the
// watchdog had not seen counts as a change seen now.
func (w *Watchdog) readHeartbeats(ctx context.Context, kv jetstream.KeyValue) error {
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	keys, err := kv.ListKeys(lctx)
	if err != nil {
		return err
	}
	for key := range keys.Keys() {
		if e, err := kv.Get(lctx, key); err == nil {
			w.noteBeat(e, false)
		}
	}
	return nil
}

// raiseFloor makes no silence before at count (the loop's).
func (w *Watchdog) raiseFloor(at time.Time) {
	if at.After(w.floor) {
		w.floor = at
	}
}

// heard is, for every host of the fold, when this watchdog last saw it
// alive on its own clock, no earlier than the floor: what Decide judges
// (the loop's).
func (w *Watchdog) heard(now time.Time) map[string]time.Time {
	if ttl := w.params.HostTTL; !w.lastRound.IsZero() && (now.Before(w.lastRound) || now.Sub(w.lastRound) > ttl) {
		w.logger.Warn("the watchdog's clock moved by more than the host TTL between two rounds (a clock step, or the process stood still); no host is judged lost for one TTL",
			"gap", now.Sub(w.lastRound), "host_ttl", ttl)
		w.raiseFloor(now)
	}
	w.lastRound = now
	seen := make(map[string]time.Time, len(w.Fold.Hosts))
	w.hbMu.Lock()
	defer w.hbMu.Unlock()
	for name, h := range w.Fold.Hosts {
		// A new advertisement in the fold counts as seeing the host: one
		// that announced itself and has not beaten yet is judged from it.
		if a, ok := w.announced[name]; !ok || a.boot != h.Boot || !a.at.Equal(h.OnlineAt) {
			w.announced[name] = announcement{boot: h.Boot, at: h.OnlineAt, seen: now}
		}
		last := w.floor
		if s := w.announced[name].seen; s.After(last) {
			last = s
		}
		if b, ok := w.beats[name]; ok && b.seen.After(last) {
			last = b.seen
		}
		seen[name] = last
	}
	return seen
}

// HostLiveness is one host's heartbeat as the watchdog saw it, in /healthz.
type HostLiveness struct {
	Host string `json:"host"`
	// SilentSeconds: how long ago, on the watchdog's clock, it last saw the
	// host's heartbeat change (or the host announce itself, or its own
	// grace begin).
	SilentSeconds float64 `json:"silent_seconds"`
	// LastHeartbeat is the time the agent wrote in its last heartbeat, on
	// the agent's clock (display only).
	LastHeartbeat *time.Time `json:"last_heartbeat,omitempty"`
	// ClockSkewSeconds is the agent's clock minus the watchdog's, measured
	// when the watchdog saw a heartbeat change (plus the heartbeat's transit
	// time): negative when the agent's clock is behind. Reported, never
	// acted on; absent until a change was seen live.
	ClockSkewSeconds *float64 `json:"clock_skew_seconds,omitempty"`
}

// liveness is the hosts' liveness for health and metrics, by host name.
func (w *Watchdog) liveness(now time.Time, seen map[string]time.Time) []HostLiveness {
	out := make([]HostLiveness, 0, len(seen))
	w.hbMu.Lock()
	for name, last := range seen {
		l := HostLiveness{Host: name, SilentSeconds: now.Sub(last).Seconds()}
		if b, ok := w.beats[name]; ok {
			at := b.at
			l.LastHeartbeat = &at
			if b.skewKnown {
				s := b.skew.Seconds()
				l.ClockSkewSeconds = &s
			}
		}
		out = append(out, l)
	}
	w.hbMu.Unlock()
	sort.Slice(out, func(i, k int) bool { return out[i].Host < out[k].Host })
	return out
}
