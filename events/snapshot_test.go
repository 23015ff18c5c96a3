package events_test

import (
	"bytes"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"pgregory.net/rapid"
)

// Law 9: a snapshot is only a shortcut. For any valid history and any cut
// point, folding the head, snapshotting, restoring and folding the tail gives
// exactly the projection a full replay gives (byte for byte, status and
// invariants included).
func TestPropertySnapshotPlusTailEqualsFullReplay(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := genHistory(t)
		cut := rapid.IntRange(0, len(h)).Draw(t, "cut")
		full := events.NewFleet()
		for _, e := range h {
			full.Apply(e)
		}
		head := events.NewFleet()
		for _, e := range h[:cut] {
			head.Apply(e)
		}
		snap, err := events.MarshalSnapshot(head)
		if err != nil {
			t.Fatal(err)
		}
		restored, err := events.UnmarshalSnapshot(snap)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range h[cut:] {
			restored.Apply(e)
		}
		want, _ := events.MarshalSnapshot(full)
		got, _ := events.MarshalSnapshot(restored)
		if !bytes.Equal(want, got) {
			t.Fatalf("snapshot at %d of %d + tail differs from a full replay:\nfull     %s\nrestored %s", cut, len(h), want, got)
		}
		if vs := restored.Check(); len(vs) != 0 {
			t.Fatalf("restored fold breaks invariants: %v", vs)
		}
	})
}

// Given any valid history folded up to any cut (settled at random points),
// when the fold is frozen for a snapshot and then goes on folding the tail
// (and settling) before the frozen copy is encoded, then the encoding is
// byte for byte the snapshot of the fold at the cut: nothing the tail does
// reaches the copy a service's loop hands off to be encoded.
func TestPropertyAFrozenSnapshotIsTheFoldAtTheFreeze(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := genHistory(t)
		cut := rapid.IntRange(0, len(h)).Draw(t, "cut")
		f := events.NewFleet()
		var now time.Time
		apply := func(e events.Event) {
			now = later(now, e.Time)
			f.Apply(e)
			if rapid.IntRange(0, 4).Draw(t, "compact") == 0 {
				f.CompactAfter(now, time.Duration(rapid.IntRange(0, 30).Draw(t, "settle s"))*time.Second, 1000*time.Hour)
			}
		}
		for _, e := range h[:cut] {
			apply(e)
		}
		want, err := events.MarshalSnapshot(f)
		if err != nil {
			t.Fatal(err)
		}
		frozen, err := events.FreezeSnapshot(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range h[cut:] {
			apply(e)
		}
		f.CompactAfter(now.Add(time.Hour), 0, 1000*time.Hour)
		got, err := frozen.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(want, got) {
			t.Fatalf("the frozen snapshot at %d of %d changed as the fold went on:\nat the freeze %s\nencoded later %s", cut, len(h), want, got)
		}
	})
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// A snapshot of another version is refused, so the caller replays instead.
func TestSnapshotOfAnotherVersionIsRefused(t *testing.T) {
	if _, err := events.UnmarshalSnapshot([]byte(`{"version":99}`)); err == nil {
		t.Fatal("accepted a snapshot of version 99")
	}
	if _, err := events.UnmarshalSnapshot([]byte(`not json`)); err == nil {
		t.Fatal("accepted garbage")
	}
}

// Given a fold of 2,000 jobs' whole records (a snapshot of megabytes),
// when it is encoded into a writer, then the writer gets it in pieces of
// at most a few tens of kilobytes, never the whole text at once (encoded
// in one piece, a fold of 10,000 running jobs took about 80 MB a snapshot
// in the scale bench's heap), and the pieces decode to the same fold:
// marshalled again, it gives the same bytes.
func TestASnapshotIsEncodedInPiecesThatDecodeToTheSameFold(t *testing.T) {
	f, seq := hostsFleet()
	for j := 0; j < 2000; j++ {
		for _, p := range benchLifecycle(int64(j+1), "host-"+strconv.Itoa(j%10), stageDone) {
			seq++
			f.Apply(decoded(t, events.New("berth/test", t0.Add(time.Duration(seq)*time.Millisecond), p), seq))
		}
	}
	z, err := events.FreezeSnapshot(f)
	if err != nil {
		t.Fatal(err)
	}
	var whole bytes.Buffer
	w := &counter{}
	if err := z.Encode(io.MultiWriter(&whole, w)); err != nil {
		t.Fatal(err)
	}
	if w.n < 1<<20 || w.largest > 64<<10 {
		t.Fatalf("encoded %d bytes, the largest piece %d: want at least 1 MiB in pieces of at most 64 KiB", w.n, w.largest)
	}
	back, err := events.UnmarshalSnapshot(whole.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Jobs) != 2000 || len(back.Attempts) != 2000 {
		t.Fatalf("decoded %d jobs and %d attempts, want 2000 each", len(back.Jobs), len(back.Attempts))
	}
	again, err := events.MarshalSnapshot(back)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, whole.Bytes()) {
		t.Fatalf("the decoded fold marshals to %d bytes that differ from the %d encoded", len(again), whole.Len())
	}
}
