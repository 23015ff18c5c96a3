package dispatch

import (
	"time"
)

// Installation is one GitHub installation beyond the default (config:
// dispatcher.github as a list): its jobs carry Name (events.JobRef.
// Installation) and are served only by pools of that installation, so its
// JIT configs, reads and deletions go through its own Minter, and its rate
// budget pauses only its own pools.
type Installation struct {
	Name   string
	Minter Minter
	// Budget learns this installation's REST budget (nil: never paused).
	Budget *Budget
	// SweepScope and SweepOrg are Options.SweepScope and SweepOrg for it.
	SweepScope, SweepOrg string
}

// installs is every installation, the default (Name "") first: the
// dispatcher's Minter, Options.Budget and sweep scope, then
// Options.Installations.
func (d *Dispatcher) installs() []Installation { return d.gh }

// install is the installation named name, false when none is configured
// (a job of an installation since removed from the config: nothing of it
// is called).
func (d *Dispatcher) install(name string) (Installation, bool) {
	for _, in := range d.installs() {
		if in.Name == name {
			return in, true
		}
	}
	return Installation{}, false
}

// blocked reports whether GitHub says to wait on this installation's calls.
func (in Installation) blocked(now time.Time) (bool, time.Time) {
	if in.Budget == nil {
		return false, time.Time{}
	}
	return in.Budget.Blocked(now)
}
