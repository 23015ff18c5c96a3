package eventlog_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/nats-io/nats.go/jetstream"
)

// saveSnapshot stores a fold under key, as a service's loop does.
func saveSnapshot(t *testing.T, js jetstream.JetStream, key string, f *events.Fleet) {
	t.Helper()
	kv, err := js.CreateOrUpdateKeyValue(ctxFor(t), jetstream.KeyValueConfig{Bucket: events.BucketSnapshots, History: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctxFor(t), key, snapBytes(t, f)); err != nil {
		t.Fatal(err)
	}
}

// foldUpTo folds the kept facts up to and including seq.
func (h *history) foldUpTo(seq uint64) *events.Fleet {
	f := events.NewFleet()
	for _, ev := range h.kept {
		if ev.Seq <= seq {
			f.Apply(ev)
		}
	}
	return f
}

func (h *history) last() uint64 { return h.kept[len(h.kept)-1].Seq }

// Given a log that still starts at seq 1, ReplayFrom folds all of it, and
// reports progress ending at (total, total).
func TestReplayFromFoldsTheWholeLogWhileNothingExpired(t *testing.T) {
	js, app := startWith(t, eventlog.StreamConfig{})
	h := newHistory(t, app)
	h.host("host-a")
	for i := range 3 {
		h.job("host-a", i == 0)
	}
	var calls [][2]uint64
	f, base, err := eventlog.ReplayFrom(ctxFor(t), js, 0, time.Time{}, func(d, n uint64) { calls = append(calls, [2]uint64{d, n}) })
	if err != nil {
		t.Fatal(err)
	}
	if base.Snapshot != "" || base.FirstSeq != 1 {
		t.Errorf("base %+v: want a full replay from seq 1", base)
	}
	if got, want := snapBytes(t, f), h.fold(); !bytes.Equal(got, want) {
		t.Errorf("replay:\n got %s\nwant %s", got, want)
	}
	if n := uint64(len(h.kept)); len(calls) == 0 || calls[len(calls)-1] != [2]uint64{n, n} {
		t.Errorf("progress calls %v: want the last one (%d, %d)", calls, n, n)
	}
}

// Given a log whose oldest facts expired, when it is replayed, then the
// replay starts from the newest whole-log snapshot that covers what expired
// and equals the fold of every fact; when facts expire past every snapshot,
// it refuses, saying what is missing and what to do, and never uses an
// agent's (partial) snapshot.
func TestReplayFromATruncatedLogStartsFromASnapshotOrSaysWhatIsMissing(t *testing.T) {
	js, app := startWith(t, eventlog.StreamConfig{MaxMsgs: 10})
	ctx := ctxFor(t)
	h := newHistory(t, app)
	h.host("host-a")
	for range 5 {
		h.job("host-a", true)
	}
	h.job("host-a", false)
	snap := h.last()
	saveSnapshot(t, js, "watchdog", h.foldUpTo(snap))
	saveSnapshot(t, js, "dispatcher", h.foldUpTo(snap-5)) // older, and no longer covering
	for range 2 {
		h.job("host-a", true)
	}
	first := streamState(t, js).FirstSeq
	if first <= 1 || first-1 > snap {
		t.Fatalf("log starts at seq %d, snapshot at %d: the test needs the snapshot covering expired facts", first, snap)
	}

	// When replayed to the end: the snapshot plus the tail.
	var calls [][2]uint64
	f, base, err := eventlog.ReplayFrom(ctx, js, 0, time.Time{}, func(d, n uint64) { calls = append(calls, [2]uint64{d, n}) })
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	if base.Snapshot != "watchdog" || base.SnapshotSeq != snap || base.FirstSeq != first {
		t.Errorf("base %+v: want the watchdog's snapshot at seq %d, log from seq %d", base, snap, first)
	}
	if got, want := snapBytes(t, f), h.fold(); !bytes.Equal(got, want) {
		t.Errorf("snapshot + tail:\n got %s\nwant %s", got, want)
	}
	if tail := h.last() - snap; len(calls) == 0 || calls[len(calls)-1] != [2]uint64{tail, tail} {
		t.Errorf("progress calls %v: want the last one (%d, %d): the tail", calls, tail, tail)
	}
	// As of a sequence after the snapshot, and as of now.
	if f, _, err := eventlog.ReplayFrom(ctx, js, snap+2, time.Time{}, nil); err != nil || !bytes.Equal(snapBytes(t, f), snapBytes(t, h.foldUpTo(snap+2))) {
		t.Errorf("replay as of seq %d: %v, or not the fold of the facts up to it", snap+2, err)
	}
	if f, _, err := eventlog.ReplayFrom(ctx, js, 0, time.Now().Add(time.Minute), nil); err != nil || !bytes.Equal(snapBytes(t, f), h.fold()) {
		t.Errorf("replay as of a minute from now: %v, or not the fold of every fact", err)
	}

	// When asked for a point before the snapshot, or in the expired part,
	// or a time before the snapshot's last fact: refused, saying why.
	for _, tc := range []struct {
		name  string
		seq   uint64
		until time.Time
		want  []string
	}{
		{"seq before the snapshot", snap - 1, time.Time{}, []string{"watchdog is at seq", "past the seq"}},
		{"seq in the expired part", first - 2, time.Time{}, []string{"have expired", "ask for seq"}},
		{"time before the snapshot", 0, h.kept[snap-1].Time.Add(-time.Millisecond), []string{"watchdog", "after the time asked for"}},
	} {
		_, _, err := eventlog.ReplayFrom(ctx, js, tc.seq, tc.until, nil)
		if !errors.Is(err, eventlog.ErrTruncated) {
			t.Errorf("%s: %v, want ErrTruncated", tc.name, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error does not say %q:\n%v", tc.name, w, err)
			}
		}
	}

	// When more facts expire than the snapshots cover (an agent's snapshot
	// that would cover is no fleet), then it refuses.
	for range 3 {
		h.job("host-a", true)
	}
	saveSnapshot(t, js, "agent-host-a", h.foldUpTo(h.last()))
	_, _, err = eventlog.ReplayFrom(ctx, js, 0, time.Time{}, nil)
	if !errors.Is(err, eventlog.ErrTruncated) {
		t.Fatalf("replay past every snapshot: %v, want ErrTruncated", err)
	}
	for _, w := range []string{"have expired", "watchdog covers only seq", "dispatcher covers only seq", events.BucketSnapshots,
		"Start a dispatcher or watchdog", "max_age"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error does not say %q:\n%v", w, err)
		}
	}
}

// Given a truncated log and no snapshot bucket at all, the replay refuses
// and says the bucket is missing.
func TestReplayFromATruncatedLogWithoutSnapshotsRefuses(t *testing.T) {
	js, app := startWith(t, eventlog.StreamConfig{MaxMsgs: 5})
	h := newHistory(t, app)
	h.host("host-a")
	for range 3 {
		h.job("host-a", true)
	}
	_, _, err := eventlog.ReplayFrom(ctxFor(t), js, 0, time.Time{}, nil)
	if !errors.Is(err, eventlog.ErrTruncated) || !strings.Contains(err.Error(), "bucket cannot be read") {
		t.Errorf("replay: %v, want ErrTruncated saying the snapshot bucket cannot be read", err)
	}
}

// CheckCovers tells a restarting service whether its snapshot still joins
// the log: it does while the facts after it are kept, not once they expired.
func TestCheckCoversTellsWhetherASnapshotStillJoinsTheLog(t *testing.T) {
	js, app := startWith(t, eventlog.StreamConfig{MaxMsgs: 5})
	ctx := ctxFor(t)
	if err := eventlog.CheckCovers(ctx, js, 0); err != nil {
		t.Errorf("empty log: %v", err)
	}
	h := newHistory(t, app)
	h.host("host-a")
	h.job("host-a", true) // seq 1..5: nothing expired yet
	if err := eventlog.CheckCovers(ctx, js, 0); err != nil {
		t.Errorf("a fresh fold of a whole log: %v", err)
	}
	h.job("host-a", true) // seq 6..9: 1..4 expired
	first := streamState(t, js).FirstSeq
	if err := eventlog.CheckCovers(ctx, js, first-1); err != nil {
		t.Errorf("a snapshot at seq %d, log from %d: %v", first-1, first, err)
	}
	err := eventlog.CheckCovers(ctx, js, first-2)
	if !errors.Is(err, eventlog.ErrTruncated) || !strings.Contains(err.Error(), "log now starts at seq") {
		t.Errorf("a snapshot at seq %d, log from %d: %v, want ErrTruncated", first-2, first, err)
	}
	if err := eventlog.CheckCovers(ctx, js, 0); !errors.Is(err, eventlog.ErrTruncated) {
		t.Errorf("a fresh fold of a truncated log: %v, want ErrTruncated", err)
	}
}
