package events_test

import (
	"bytes"
	"testing"

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

// A snapshot of another version is refused, so the caller replays instead.
func TestSnapshotOfAnotherVersionIsRefused(t *testing.T) {
	if _, err := events.UnmarshalSnapshot([]byte(`{"version":99}`)); err == nil {
		t.Fatal("accepted a snapshot of version 99")
	}
	if _, err := events.UnmarshalSnapshot([]byte(`not json`)); err == nil {
		t.Fatal("accepted garbage")
	}
}
