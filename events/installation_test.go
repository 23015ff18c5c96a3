package events_test

import (
	"testing"

	"github.com/berth-ci/berth/events"
)

// twoInstallations is a host offering pools acme-mac and globex-mac with
// the same labels, each serving its own GitHub installation.
func twoInstallations() *events.HostOnline {
	h := hostOnline("h1", 4, nil)
	h.CurveKey = "X"
	labels := []string{"self-hosted", "macos"}
	h.Pools["acme-mac"] = events.PoolSlots{Labels: labels, Slots: 2, Installation: "acme"}
	h.Pools["globex-mac"] = events.PoolSlots{Labels: labels, Slots: 2, Installation: "globex"}
	return h
}

func installationJob(id int64, installation string) *events.JobQueued {
	r := job(id, "self-hosted", "macos")
	r.Installation = installation
	return &events.JobQueued{JobRef: r}
}

// Given two installations whose pools share labels, when a job of each is
// queued, then each is demand on its own installation's pool only, and a
// job of the unnamed installation matches neither.
func TestAJobIsMatchedOnlyAmongItsInstallationsPools(t *testing.T) {
	f := given(ev(1, 0, twoInstallations()),
		ev(2, 1, installationJob(10, "globex")), ev(3, 2, installationJob(11, "acme")), ev(4, 3, installationJob(12, "")))
	m := f.NewMatcher()
	for id, want := range map[int64]string{10: "globex-mac", 11: "acme-mac", 12: ""} {
		if got := m.MatchJob(f.Jobs[id]); got != want {
			t.Errorf("job %d (installation %q) matched pool %q, want %q", id, f.Jobs[id].Installation, got, want)
		}
	}
	demand := map[string]int{}
	for _, p := range f.Status().Pools {
		demand[p.Name] = p.PendingDemand
	}
	if demand["acme-mac"] != 1 || demand["globex-mac"] != 1 {
		t.Errorf("pending demand %v, want one job on each installation's pool", demand)
	}
	if got := f.PoolInstallations(); got["acme-mac"] != "acme" || got["globex-mac"] != "globex" {
		t.Errorf("pool installations %v", got)
	}
}

// Given a grant of a pool for installation acme, when the host claims the
// pool for globex, then the pool is not offered and the over-claim says
// why: a host cannot take another installation's jobs by claiming them.
func TestAPoolClaimedForAnotherInstallationThanGrantedIsNotOffered(t *testing.T) {
	claim := twoInstallations()
	g := events.GrantClaim(*claim)
	p := g.Pools["globex-mac"]
	p.Installation = "acme"
	g.Pools["globex-mac"] = p
	f := ungranted(ev(1, 0, &g), ev(2, 1, claim))
	h := f.Hosts["h1"]
	if _, ok := h.Pools["globex-mac"]; ok || len(h.Pools) != 1 {
		t.Fatalf("offered %v: want only acme-mac (globex-mac is granted for acme)", offered(h))
	}
	if len(h.Overclaim) != 1 {
		t.Errorf("over-claim %q, want globex-mac's installation", h.Overclaim)
	}
}

// Given jobs of two installations in repositories of their own, when the
// fold is asked where each installation's client polls and sweeps, then
// each gets only its own repositories, from the fold's repository history
// (kept apart from the job records compaction removes), also after a
// snapshot: one installation's client cannot read another's repositories.
func TestEachInstallationKeepsItsOwnRepositories(t *testing.T) {
	acme, dflt := installationJob(10, "acme"), installationJob(11, "")
	acme.Org, acme.Repo = "acme", "app"
	dflt.Org, dflt.Repo = "example-org", "example-repo"
	f := given(ev(1, 0, acme), ev(2, 1, dflt))
	check := func(when string, f *events.Fleet) {
		t.Helper()
		if got := f.Repos("acme"); len(got) != 1 || got[0] != [2]string{"acme", "app"} {
			t.Errorf("%s: acme's repositories %v, want acme/app only", when, got)
		}
		if got := f.Repos(""); len(got) != 1 || got[0] != [2]string{"example-org", "example-repo"} {
			t.Errorf("%s: the default installation's repositories %v, want example-org/example-repo only", when, got)
		}
	}
	check("folded", f)
	b, err := events.MarshalSnapshot(f)
	if err != nil {
		t.Fatal(err)
	}
	back, err := events.UnmarshalSnapshot(b)
	if err != nil {
		t.Fatal(err)
	}
	check("after a snapshot", back)
}
