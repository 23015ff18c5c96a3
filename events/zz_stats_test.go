package events_test

import (
	"testing"
	"pgregory.net/rapid"
	"github.com/berth-ci/berth/events"
)

func TestZZStats(t *testing.T) {
	lens := []int{}
	types := map[string]int{}
	cross, late, maxHeld := 0, 0, 0
	rapid.Check(t, func(rt *rapid.T) {
		h := genHistory(rt)
		lens = append(lens, len(h))
		for _, e := range h {
			types[e.Type()]++
			if ip, ok := e.Data.(*events.JobInProgress); ok {
				if events.AttemptID(ip.JobID, 1) != ip.RunnerName && events.AttemptID(ip.JobID, 2) != ip.RunnerName && events.AttemptID(ip.JobID, 3) != ip.RunnerName {
					cross++
				}
			}
			if s, ok := e.Data.(*events.AttemptStopped); ok && s.Late {
				late++
			}
		}
		f := given(h...)
		for _, p := range f.Pools { if p.Held > maxHeld { maxHeld = p.Held } }
	})
	t.Logf("lens %v", lens)
	t.Logf("types %v cross %d late %d maxHeld %d", types, cross, late, maxHeld)
}
