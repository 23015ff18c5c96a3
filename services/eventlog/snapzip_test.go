package eventlog

import (
	"bytes"
	"io"
	"testing"

	"github.com/klauspost/compress/gzip"
)

// Given a process that saves many small snapshots (an agent's fold is a
// few kilobytes; the bench runs 500 agents in one process), when each is
// compressed, then the compressors are reused, not made anew (a new one
// allocates about 1 MB of tables), and each snapshot still reads back.
func TestASmallSnapshotIsCompressedWithoutNewTables(t *testing.T) {
	snap := bytes.Repeat([]byte(`{"attempt":"12345-1","host":"host-7","pool":"linux"},`), 80) // about 4 KB
	const n = 50
	before := compressorsMade.Load()
	for range n {
		z, err := gzipSnapshot(func(w io.Writer) error {
			_, err := w.Write(snap)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if back := gunzip(t, z.Bytes()); !bytes.Equal(back, snap) {
			t.Fatalf("round trip: %d bytes back, want the %d stored", len(back), len(snap))
		}
	}
	// Loops of other tests in this package may snapshot meanwhile and
	// hold some of the kept writers: a few new ones, not one a snapshot.
	if made := compressorsMade.Load() - before; made > 5 {
		t.Fatalf("%d compressors made for %d snapshots, want them reused (at most 5 new)", made, n)
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
