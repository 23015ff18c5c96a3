package dispatch

import (
	"sort"
	"time"

	"github.com/berth-ci/berth/events"
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

// installationRepos is each repository of name's jobs, sorted: with one
// installation every repository the fold names (ReconcileRepos); with
// several, those of the jobs the fold holds for name (one installation's
// client cannot read another's repositories).
func (d *Dispatcher) installationRepos(name string) [][2]string {
	if len(d.installs()) == 1 {
		return ReconcileRepos(d.Fold)
	}
	seen := map[[2]string]bool{}
	var out [][2]string
	for _, j := range d.Fold.Jobs {
		if r := [2]string{j.Org, j.Repo}; j.Installation == name && j.Org != "" && !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a][0]+"/"+out[a][1] < out[b][0]+"/"+out[b][1] })
	return out
}

// jobInstallation is the installation a job's attempt is served for.
func (d *Dispatcher) attemptInstallation(a *events.Attempt) string {
	if j := d.Fold.Jobs[a.JobID]; j != nil {
		return j.Installation
	}
	return d.Fold.PoolInstallations()[a.Pool]
}
