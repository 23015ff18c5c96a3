package eventlog

import (
	"bytes"
	"io"
	"runtime"
	"testing"

	"github.com/klauspost/compress/gzip"
)

// Given a process that saves many small snapshots (an agent's fold is a
// few kilobytes; the bench runs 500 agents in one process), when each is
// compressed, then it costs about its own size, not a new compressor's
// tables (about 1 MB each): the compressors are reused.
func TestASmallSnapshotIsCompressedWithoutNewTables(t *testing.T) {
	snap := bytes.Repeat([]byte(`{"attempt":"12345-1","host":"host-7","pool":"linux"},`), 80) // about 4 KB
	if _, err := gzipSnapshot(snap); err != nil {                                             // the first makes the pool's compressor
		t.Fatal(err)
	}
	const n = 50
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	zs := make([]*bytes.Buffer, n)
	for i := range zs {
		z, err := gzipSnapshot(snap)
		if err != nil {
			t.Fatal(err)
		}
		zs[i] = z
	}
	runtime.ReadMemStats(&after)
	for _, z := range zs {
		if back := gunzip(t, z.Bytes()); !bytes.Equal(back, snap) {
			t.Fatalf("round trip: %d bytes back, want the %d stored", len(back), len(snap))
		}
	}
	// A GC in the loop may empty the pool once; allow one new compressor.
	if per := (after.TotalAlloc - before.TotalAlloc) / n; per > 64<<10 {
		t.Fatalf("%d bytes allocated per compression of a %d-byte snapshot, want under 64 KiB (a new compressor's tables are about 1 MB)", per, len(snap))
	}
}

func gunzip(t *testing.T, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
