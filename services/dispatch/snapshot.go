package dispatch

import "github.com/berth-ci/berth/events"

// SaveFold implements eventlog.Snapshotter (called on the loop).
func (d *Dispatcher) SaveFold() ([]byte, uint64, error) {
	b, err := events.MarshalSnapshot(d.fleet)
	return b, d.fleet.LastSeq, err
}

// RestoreFold implements eventlog.Snapshotter (called before the loop runs).
func (d *Dispatcher) RestoreFold(b []byte) (uint64, error) {
	f, err := events.UnmarshalSnapshot(b)
	if err != nil {
		return 0, err
	}
	d.fleet = f
	return f.LastSeq, nil
}
