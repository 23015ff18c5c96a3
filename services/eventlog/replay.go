package eventlog

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/nats-io/nats.go/jetstream"
)

// WholeLogSnapshotKeys are the keys in events.BucketSnapshots whose
// snapshots fold the whole log (the dispatcher's and the watchdog's); an
// agent's snapshot folds only its host's subjects and is never a base for a
// fleet replay.
var WholeLogSnapshotKeys = []string{events.SnapshotKeyDispatcher, events.SnapshotKeyWatchdog}

// ErrTruncated is returned by ReplayFrom when the facts a replay needs have
// expired under the stream's retention limits and no snapshot covers them.
var ErrTruncated = errors.New("event log truncated")

// ReplayBase says what a replay started from.
type ReplayBase struct {
	// FirstSeq is the stream's first sequence when the replay started: 1
	// (or 0 for an empty stream) while nothing has expired.
	FirstSeq uint64
	// Snapshot is the key of the snapshot the fold started from, "" when it
	// folded the log from sequence 1; SnapshotSeq is the sequence it covers.
	Snapshot    string
	SnapshotSeq uint64
}

// ReplayFrom folds the log up to and including sequence upto (0: the last
// sequence when it starts), stopping before the first event stamped after
// until (zero: no time limit): the fleet as it was then.
//
// While the stream still starts at sequence 1 it folds the whole log, like
// ReplayTo. Once old facts have expired (the stream's first sequence F > 1)
// it starts from the newest whole-log snapshot in events.BucketSnapshots that covers
// F-1 and is not past the point asked for, and folds the tail after it. A
// snapshot is a service's fold: terminal records older than the services'
// retention are no longer in it. When no snapshot covers what expired, or
// the point asked for lies in the expired part, it returns an error wrapping
// ErrTruncated that says what is missing; it never returns a fold silently
// missing facts.
//
// progress, when not nil, is called with (facts folded, facts to fold) about
// every thousand facts and once at the end.
func ReplayFrom(ctx context.Context, js jetstream.JetStream, upto uint64, until time.Time, progress func(done, total uint64)) (*events.Fleet, ReplayBase, error) {
	s, err := js.Stream(ctx, events.StreamName)
	if err != nil {
		return nil, ReplayBase{}, fmt.Errorf("stream %s: %w (has any Berth service started against this NATS?)", events.StreamName, err)
	}
	state := s.CachedInfo().State
	base := ReplayBase{FirstSeq: state.FirstSeq}
	last := state.LastSeq
	if last == 0 {
		return events.NewFleet(), base, nil
	}
	if upto != 0 && upto < last {
		last = upto
	}
	if state.FirstSeq <= 1 {
		f, err := foldTail(ctx, js, events.NewFleet(), 1, last, until, progress)
		return f, base, err
	}
	expired := state.FirstSeq - 1 // facts 1..expired are gone
	if last < expired {
		return nil, base, fmt.Errorf("%w: replay as of seq %d asked for, but facts up to seq %d have expired under the stream's retention limits (the log now starts at seq %d): ask for seq %d or later",
			ErrTruncated, last, expired, state.FirstSeq, expired)
	}
	snaps, notes := loadSnapshots(ctx, js)
	var tried []string
	for _, sn := range snaps {
		switch {
		case sn.fleet.LastSeq < expired:
			tried = append(tried, fmt.Sprintf("%s covers only seq %d", sn.key, sn.fleet.LastSeq))
			continue
		case sn.fleet.LastSeq > last:
			tried = append(tried, fmt.Sprintf("%s is at seq %d, past the seq %d asked for", sn.key, sn.fleet.LastSeq, last))
			continue
		}
		if !until.IsZero() {
			ok, why := snapshotNotAfter(ctx, s, sn.fleet.LastSeq, until)
			if !ok {
				tried = append(tried, fmt.Sprintf("%s (seq %d): %s", sn.key, sn.fleet.LastSeq, why))
				continue
			}
		}
		base.Snapshot, base.SnapshotSeq = sn.key, sn.fleet.LastSeq
		f, err := foldTail(ctx, js, sn.fleet, sn.fleet.LastSeq+1, last, until, progress)
		return f, base, err
	}
	tried = append(tried, notes...)
	found := "no usable snapshot"
	if len(tried) > 0 {
		found = strings.Join(tried, "; ")
	}
	return nil, base, fmt.Errorf("%w: facts up to seq %d have expired under the stream's retention limits (the log now starts at seq %d), and no whole-log snapshot in KV bucket %s covers them (%s). "+
		"A replay from the log alone would be missing them. Start a dispatcher or watchdog (each saves its fold there every minute) and run this again; "+
		"to keep more history, raise nats.max_age, max_bytes or max_msgs",
		ErrTruncated, expired, state.FirstSeq, events.BucketSnapshots, found)
}

type namedSnapshot struct {
	key   string
	fleet *events.Fleet
}

// loadSnapshots reads the whole-log snapshots, newest first, and notes why
// any key could not be used.
func loadSnapshots(ctx context.Context, js jetstream.JetStream) ([]namedSnapshot, []string) {
	kctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	kv, err := js.KeyValue(kctx, events.BucketSnapshots)
	if err != nil {
		return nil, []string{fmt.Sprintf("the bucket cannot be read: %v", err)}
	}
	var out []namedSnapshot
	var notes []string
	for _, key := range WholeLogSnapshotKeys {
		b, err := GetSnapshot(kctx, kv, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			notes = append(notes, key+": none saved")
			continue
		}
		if err != nil {
			notes = append(notes, fmt.Sprintf("%s: %v", key, err))
			continue
		}
		f, err := events.UnmarshalSnapshot(b)
		if err != nil {
			notes = append(notes, fmt.Sprintf("%s: %v", key, err))
			continue
		}
		out = append(out, namedSnapshot{key: key, fleet: f})
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].fleet.LastSeq > out[b].fleet.LastSeq })
	return out, notes
}

// snapshotNotAfter reports whether a snapshot at seq is a fold of facts all
// stamped at or before until. Like ReplayTo, it takes stamps to grow with
// sequence, so it reads the fact at seq itself; an expired one cannot tell.
func snapshotNotAfter(ctx context.Context, s jetstream.Stream, seq uint64, until time.Time) (bool, string) {
	m, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, "its last fact has expired, so whether it lies before the time asked for cannot be told"
	}
	if err != nil {
		return false, fmt.Sprintf("read seq %d: %v", seq, err)
	}
	ev, err := events.Unmarshal(m.Data, seq)
	if err != nil {
		return true, "" // an undecodable fact has no stamp; it orders nothing
	}
	ev.ClampToStored(m.Time)
	if ev.Time.After(until) {
		return false, fmt.Sprintf("its last fact is stamped %s, after the time asked for", ev.Time.Format(time.RFC3339))
	}
	return true, ""
}

// foldTail folds facts from..last into f, stopping before the first one
// stamped after until (zero: no limit). It fails with ErrTruncated if the
// first fact it reads is not from (it expired while the replay started).
// It reads with batched direct gets (Scan): no consumer is made.
func foldTail(ctx context.Context, js jetstream.JetStream, f *events.Fleet, from, last uint64, until time.Time, progress func(done, total uint64)) (*events.Fleet, error) {
	scan := func(ctx context.Context, from, upTo uint64, fn func(Delivered) error) (uint64, error) {
		return Scan(ctx, js, events.SubjectAll, from, upTo, fn)
	}
	return foldScan(ctx, scan, f, from, last, until, progress)
}

// errUntil ends a scan at the first fact stamped after the time asked for.
var errUntil = errors.New("past the time asked for")

func foldScan(ctx context.Context, scan func(context.Context, uint64, uint64, func(Delivered) error) (uint64, error),
	f *events.Fleet, from, last uint64, until time.Time, progress func(done, total uint64)) (*events.Fleet, error) {
	if from > last {
		if progress != nil {
			progress(0, 0)
		}
		return f, nil
	}
	total := last - from + 1
	report := func(seq uint64) {
		if progress != nil {
			progress(seq-from+1, total)
		}
	}
	first := true
	next, err := scan(ctx, from, last, func(d Delivered) error {
		ev, derr := d.Event, d.Err
		seq := ev.Seq
		if first && seq != from {
			return fmt.Errorf("%w: the replay needs seq %d onwards, but the log now starts at seq %d (facts expired while it started); run it again",
				ErrTruncated, from, seq)
		}
		first = false
		if !until.IsZero() && derr == nil && ev.Time.After(until) {
			report(seq - 1)
			return errUntil
		}
		if derr == nil {
			// A fact its subject does not confirm is refused here as in
			// every service's shell (law 10): `berth status` and `berth
			// replay` never show what a forger wrote.
			_, derr = events.Admit(f, ev)
		}
		if derr != nil || foldSafely(f, ev) != nil {
			f.Skip(seq, ev.Subject)
		}
		if (seq-from+1)%1000 == 0 {
			report(seq)
		}
		return nil
	})
	switch {
	case errors.Is(err, errUntil):
		return f, nil
	case err != nil:
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return f, fmt.Errorf("replay stopped at seq %d of %d: %w", next-1, last, err)
	case next <= last && first:
		return f, fmt.Errorf("%w: the replay needs seq %d onwards, but the log holds none of %d..%d now; run it again", ErrTruncated, from, from, last)
	}
	report(last)
	return f, nil
}

// CheckCovers tells whether a fold that has applied every fact up to seq
// (a restored snapshot's sequence; 0 for a fresh fold) can go on from the
// log: it returns nil when the stream still holds every fact after seq, and
// an error wrapping ErrTruncated, saying how many facts are gone, when
// facts seq+1 .. first-1 have expired under the retention limits. A follower
// started from seq+1 would silently begin at the first fact left.
func CheckCovers(ctx context.Context, js jetstream.JetStream, seq uint64) error {
	s, err := js.Stream(ctx, events.StreamName)
	if err != nil {
		return fmt.Errorf("stream %s: %w", events.StreamName, err)
	}
	first := s.CachedInfo().State.FirstSeq
	if first <= seq+1 {
		return nil
	}
	return fmt.Errorf("%w: the fold covers seq %d, but the log now starts at seq %d: facts %d..%d expired under the stream's retention limits before anyone folded them",
		ErrTruncated, seq, first, seq+1, first-1)
}

// CatchUp folds into f the facts stored after f.LastSeq, up to the stream's
// last sequence now: the step `berth status --watch` repeats. It returns
// ErrTruncated (wrapped) when facts after f.LastSeq expired meanwhile.
func CatchUp(ctx context.Context, js jetstream.JetStream, f *events.Fleet) error {
	s, err := js.Stream(ctx, events.StreamName)
	if err != nil {
		return fmt.Errorf("stream %s: %w", events.StreamName, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return err
	}
	_, err = foldTail(ctx, js, f, f.LastSeq+1, info.State.LastSeq, time.Time{}, nil)
	return err
}
