package events_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"pgregory.net/rapid"
)

// Given any keys, packed in two batches (as two Compacts add them), with or
// without an attempt number coded apart, then exactly those keys are found,
// no neighbour of one is, the size counts each key once, and the snapshot
// form reads back the same set (issue 19: exact, never probabilistic).
func TestPropertyPackedIDsAreExact(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		low := rapid.SampledFrom([]uint8{0, 16}).Draw(t, "low")
		// Clustered keys, as job ids are: runs of near neighbours with
		// jumps of any size between them, and repeats.
		var keys []uint64
		base := rapid.Uint64().Draw(t, "base")
		for range rapid.IntRange(0, 300).Draw(t, "n") {
			if rapid.IntRange(0, 9).Draw(t, "jump") == 0 {
				base = rapid.Uint64().Draw(t, "far")
			}
			base += rapid.Uint64Range(0, 1<<20).Draw(t, "step")
			keys = append(keys, base)
		}
		cut := rapid.IntRange(0, len(keys)).Draw(t, "batch")
		want := map[uint64]bool{}
		for _, k := range keys {
			want[k] = true
		}
		has, n, back, err := events.PackedSet(low, append([]uint64(nil), keys[:cut]...), append([]uint64(nil), keys[cut:]...))
		if err != nil {
			t.Fatalf("the snapshot form does not read back: %v", err)
		}
		if n != len(want) {
			t.Fatalf("size %d, want %d distinct keys", n, len(want))
		}
		for k := range want {
			for _, probe := range []uint64{k - 1, k, k + 1, k ^ 1<<16} {
				if has(probe) != want[probe] || back(probe) != want[probe] {
					t.Fatalf("key %d: found %v (read back %v), want %v", probe, has(probe), back(probe), want[probe])
				}
			}
		}
		for range 20 {
			probe := rapid.Uint64().Draw(t, "probe")
			if has(probe) != want[probe] {
				t.Fatalf("random key %d: found %v, want %v", probe, has(probe), want[probe])
			}
		}
	})
}

// Given a day of job ids a fleet's webhooks bring (ids one apart to a
// thousand apart), when they settle, then each costs about 2 bytes (the
// block heads included), and each of its attempts (the number coded apart)
// about 3: not the 16 a job id and its time took one by one.
func TestPackedIDsCostAFewBytes(t *testing.T) {
	var jobs, attempts []uint64
	id := uint64(29_679_449_000)
	for i := range 100_000 {
		id += uint64(1 + i%1000)
		jobs = append(jobs, id^1<<63)
		attempts = append(attempts, id<<16|1)
	}
	if b := float64(events.PackedBytes(0, jobs)) / 1e5; b > 2.2 {
		t.Errorf("a settled job id costs %.2f bytes, want at most 2.2", b)
	}
	if b := float64(events.PackedBytes(16, attempts)) / 1e5; b > 3.2 {
		t.Errorf("a settled attempt id costs %.2f bytes, want at most 3.2", b)
	}
}

// Given a snapshot an earlier build wrote, with its settled ids one by one
// (an id and its time each, deliveries 24 bytes each), when this build
// restores it, then every settled id is still found and the retention
// still drops them.
func TestASnapshotOfAnEarlierBuildKeepsItsSettledIDs(t *testing.T) {
	const delivery = "72d3162e-cc78-11e3-81ab-4c9367dc0958"
	b, err := events.MarshalSnapshot(events.NewFleet())
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	at := t0.Unix()
	s["settled_jobs"] = []map[string]int64{{"id": 7, "at": at}, {"id": 9, "at": at + 4000}}
	s["settled_placements"] = []map[string]uint64{{"id": 7<<16 | 1, "at": uint64(at)}}
	// The id's 16 bytes, then the unix seconds, big-endian.
	d := []byte{0x72, 0xd3, 0x16, 0x2e, 0xcc, 0x78, 0x11, 0xe3, 0x81, 0xab, 0x4c, 0x93, 0x67, 0xdc, 0x09, 0x58, 0, 0, 0, 0, 0, 0, 0, 0}
	for i := range 8 {
		d[23-i] = byte(at >> (8 * i))
	}
	s["settled_deliveries"] = d
	old, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	f, err := events.UnmarshalSnapshot(old)
	if err != nil {
		t.Fatalf("an earlier build's snapshot does not load: %v", err)
	}
	if !f.Settled(7) || !f.Settled(9) || f.Settled(8) || !f.SettledAttempt("berth-7-1") || f.SettledAttempt("berth-7-2") || !f.DeliveryStored(delivery) {
		t.Fatalf("settled: job 7 %v, 9 %v, 8 %v; attempt berth-7-1 %v, berth-7-2 %v; delivery %v",
			f.Settled(7), f.Settled(9), f.Settled(8), f.SettledAttempt("berth-7-1"), f.SettledAttempt("berth-7-2"), f.DeliveryStored(delivery))
	}
	f.Compact(t0.Add(73*time.Hour), 72*time.Hour)
	if f.Settled(7) || !f.Settled(9) || f.SettledAttempt("berth-7-1") {
		t.Fatalf("after the retention: job 7 %v (ended 73 h ago), job 9 %v (ended 72 h ago), attempt %v", f.Settled(7), f.Settled(9), f.SettledAttempt("berth-7-1"))
	}
}

// Given a fold that drops delivery ids (the watchdog's), when job facts
// carrying them are folded and settle, then it holds none, and decides as
// one that keeps them.
func TestAFoldThatDropsDeliveryIDsHoldsNone(t *testing.T) {
	const id = "72d3162e-cc78-11e3-81ab-4c9367dc0958"
	keep, drop := events.NewFleet(), events.NewFleet()
	drop.DropDeliveryIDs()
	r := job(1, "linux")
	r.Delivery = id
	for _, f := range []*events.Fleet{keep, drop} {
		f.Apply(ev(1, 0, &events.JobQueued{JobRef: r}))
	}
	if !keep.DeliveryStored(id) || drop.DeliveryStored(id) || len(drop.Deliveries) != 0 {
		t.Fatalf("stored: keeping fold %v, dropping fold %v (%d in its map)", keep.DeliveryStored(id), drop.DeliveryStored(id), len(drop.Deliveries))
	}
	if keep.DemandCount("linux") != drop.DemandCount("linux") || !drop.KnownJob(1) {
		t.Fatalf("demand %d against %d; job known %v", drop.DemandCount("linux"), keep.DemandCount("linux"), drop.KnownJob(1))
	}
}

// Given a fold that keeps sealed JIT configs (an agent's) and one that
// drops them (the dispatcher's, the watchdog's), when both fold a placement
// and one of them is told to drop them only afterwards, then the agent's
// still holds the config its create opens, and neither other fold holds one
// while both know the attempt as placed with its runner.
func TestAFoldThatDropsSealedJITHoldsNone(t *testing.T) {
	keep, drop, late := events.NewFleet(), events.NewFleet(), events.NewFleet()
	drop.DropSealedJIT()
	r := ref("a-7-1", "linux", "host-a")
	for _, f := range []*events.Fleet{keep, drop, late} {
		f.Apply(ev(1, 0, &events.AttemptPlaced{AttemptRef: r, JobID: 7, RunnerID: 70,
			SealedJIT: []byte("SEALED"), SealedBy: "XD", SealedTo: "Xhost-a"}))
	}
	late.DropSealedJIT()
	if a := keep.Attempts[r.Attempt]; a == nil || string(a.SealedJIT) != "SEALED" || a.SealedBy != "XD" {
		t.Fatalf("the keeping fold lost the sealed config: %+v", a)
	}
	for name, f := range map[string]*events.Fleet{"dropping": drop, "dropping afterwards": late} {
		a := f.Attempts[r.Attempt]
		if a == nil || !a.Placed || a.RunnerID != 70 {
			t.Fatalf("%s fold: attempt not placed with runner 70: %+v", name, a)
		}
		if a.SealedJIT != nil || a.SealedBy != "" || a.SealedTo != "" || f.KeepsSealedJIT() {
			t.Fatalf("%s fold holds a sealed config: %q by %q to %q (keeps %v)", name, a.SealedJIT, a.SealedBy, a.SealedTo, f.KeepsSealedJIT())
		}
	}
}
