package watchdog

import "github.com/berth-ci/berth/events"

// SaveFold implements eventlog.Snapshotter (called on the loop).
func (w *Watchdog) SaveFold() ([]byte, uint64, error) {
	b, err := events.MarshalSnapshot(w.fleet)
	return b, w.fleet.LastSeq, err
}

// RestoreFold implements eventlog.Snapshotter (called before the loop runs).
func (w *Watchdog) RestoreFold(b []byte) (uint64, error) {
	f, err := events.UnmarshalSnapshot(b)
	if err != nil {
		return 0, err
	}
	w.fleet = f
	return f.LastSeq, nil
}
