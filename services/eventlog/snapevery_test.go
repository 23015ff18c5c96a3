package eventlog

import (
	"testing"
	"time"
)

// Given how long the last snapshot took to encode, then the next is due
// after the configured interval, or after twenty times the encoding when
// that is longer, up to ten times the interval: a loop spends at most a
// twentieth of its time encoding snapshots, however large its fold grows
// within the settle window, and a snapshot still comes well within the
// log's retention.
func TestSnapshotsSpaceOutWhenEncodingTakesLong(t *testing.T) {
	for _, c := range []struct {
		base, cost, want time.Duration
	}{
		{0, 0, time.Minute},
		{0, 10 * time.Millisecond, time.Minute},
		{0, 5 * time.Second, 100 * time.Second},
		{30 * time.Second, 2 * time.Second, 40 * time.Second},
		{30 * time.Second, time.Second, 30 * time.Second},
		{0, time.Minute, 10 * time.Minute}, // never past ten times the interval
	} {
		if got := snapshotEvery(c.base, c.cost); got != c.want {
			t.Errorf("every %v, last took %v: next after %v, want %v", c.base, c.cost, got, c.want)
		}
	}
}
