package vmagent

import "github.com/berth-ci/berth/events"

// SaveFold implements eventlog.Snapshotter (called on the loop).
func (a *Agent) SaveFold() ([]byte, uint64, error) {
	b, err := events.MarshalSnapshot(a.fleet)
	return b, a.fleet.LastSeq, err
}

// RestoreFold implements eventlog.Snapshotter (called before the loop runs).
func (a *Agent) RestoreFold(b []byte) (uint64, error) {
	f, err := events.UnmarshalSnapshot(b)
	if err != nil {
		return 0, err
	}
	a.fleet = f
	return f.LastSeq, nil
}
