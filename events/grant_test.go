package events_test

import (
	"reflect"
	"testing"

	"github.com/berth-ci/berth/events"
)

// grant is the admin's grant of pools (name → slots, labels as
// hostOnline gives them) with physical cap physical.
func grant(host string, physical int, pools map[string]int) *events.HostGranted {
	g := &events.HostGranted{Host: host, PhysicalCap: physical, By: "ops", Pools: map[string]events.PoolGrant{}}
	for name, n := range pools {
		g.Pools[name] = events.PoolGrant{Labels: []string{name, "self-hosted"}, Slots: n}
	}
	return g
}

func offered(h *events.Host) map[string]int {
	out := map[string]int{}
	for name, ps := range h.Pools {
		out[name] = ps.Slots
	}
	return out
}

// Given a host that announces more than the admin granted, the fold offers
// it only the pools both name, with the fewer slots and the smaller cap,
// and says how it over-claims; a pool claimed with other labels than
// granted is not offered at all.
func TestAHostIsOfferedOnlyTheIntersectionOfItsClaimAndItsGrant(t *testing.T) {
	claim := hostOnline("h1", 8, map[string]int{"linux": 4, "private": 2, "macos": 1})
	claim.CurveKey = "X"
	claim.Pools["macos"] = events.PoolSlots{Labels: []string{"self-hosted", "macos", "gpu"}, Slots: 1}
	f := ungranted(ev(1, 0, grant("h1", 3, map[string]int{"linux": 2, "macos": 1})), ev(2, 1, claim))
	h := f.Hosts["h1"]
	if got, want := offered(h), map[string]int{"linux": 2}; !reflect.DeepEqual(got, want) {
		t.Fatalf("offered %v, want %v (private is not granted, macos is claimed with a label not granted)", got, want)
	}
	if h.PhysicalCap != 3 {
		t.Errorf("physical cap %d, want the grant's 3", h.PhysicalCap)
	}
	if len(h.Overclaim) != 4 {
		t.Errorf("overclaim %q, want the slots, the cap, macos's labels and private", h.Overclaim)
	}
	if c := f.Capacity("private"); c != 0 {
		t.Errorf("capacity of private %d, want 0", c)
	}
	if _, ok := f.PoolLabels()["private"]; ok {
		t.Errorf("pool labels %v name the ungranted pool private", f.PoolLabels())
	}
	st := f.Status()
	if len(st.Hosts) != 1 || st.Hosts[0].Slots["private"] != 0 || len(st.Hosts[0].Overclaim) != 4 {
		t.Errorf("status hosts %+v: want private absent and the over-claim shown", st.Hosts)
	}
}

// Given a host with no grant, it is offered nothing, whatever it claims;
// once granted (in either order), it is offered what both say.
func TestAHostWithoutAGrantIsOfferedNothing(t *testing.T) {
	online := ev(1, 0, hostOnline("h1", 2, map[string]int{"linux": 2}))
	f := ungranted(online)
	if h := f.Hosts["h1"]; len(h.Pools) != 0 || h.PhysicalCap != 0 || len(h.Overclaim) != 1 || f.Capacity("linux") != 0 {
		t.Fatalf("ungranted host offered %v cap %d overclaim %q", offered(h), h.PhysicalCap, h.Overclaim)
	}
	granted := ev(2, 1, grant("h1", 0, map[string]int{"linux": 2}))
	for _, order := range [][]events.Event{{online, granted}, {granted, online}} {
		f := ungranted(order...)
		if h := f.Hosts["h1"]; f.Capacity("linux") != 2 || h.PhysicalCap != 2 || len(h.Overclaim) != 0 {
			t.Errorf("granted host: capacity %d cap %d overclaim %q, want 2, 2 (the grant's slots), none",
				f.Capacity("linux"), h.PhysicalCap, h.Overclaim)
		}
	}
}

// Given a granted host, a revoke (a grant with no pools) stored after it
// leaves the host offered nothing, and a grant stored after the revoke
// brings it back: the newest grant in the log wins, not the newest time.
func TestARevokeTakesEveryPoolAway(t *testing.T) {
	online := ev(1, 0, hostOnline("h1", 2, map[string]int{"linux": 2}))
	g1 := ev(2, 5, grant("h1", 0, map[string]int{"linux": 2}))
	revoke := ev(3, 1, &events.HostGranted{Host: "h1", By: "ops"}) // an earlier clock, stored later
	f := ungranted(online, g1, revoke)
	if h := f.Hosts["h1"]; len(h.Pools) != 0 || f.Capacity("linux") != 0 || len(h.Overclaim) == 0 {
		t.Fatalf("revoked host offered %v, overclaim %q", offered(h), h.Overclaim)
	}
	f.Apply(ev(4, 2, grant("h1", 0, map[string]int{"linux": 1})))
	if c := f.Capacity("linux"); c != 1 {
		t.Fatalf("capacity after a new grant %d, want 1", c)
	}
	// The fold is the same whatever order its facts arrive in.
	g := ungranted(ev(4, 2, grant("h1", 0, map[string]int{"linux": 1})), revoke, g1, online)
	if !reflect.DeepEqual(f.Status(), g.Status()) {
		t.Errorf("order changed the fold:\n%+v\n%+v", f.Status(), g.Status())
	}
}

// A snapshot keeps claim and grant apart: restored, the host is offered
// the same, and a later grant still widens it up to the claim.
func TestASnapshotKeepsTheClaimAndTheGrant(t *testing.T) {
	f := ungranted(ev(1, 0, hostOnline("h1", 4, map[string]int{"linux": 4})), ev(2, 1, grant("h1", 0, map[string]int{"linux": 1})))
	b, err := events.MarshalSnapshot(f)
	if err != nil {
		t.Fatal(err)
	}
	g, err := events.UnmarshalSnapshot(b)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []*events.Fleet{f, g} {
		x.Apply(ev(3, 2, grant("h1", 0, map[string]int{"linux": 4})))
	}
	if f.Capacity("linux") != 4 || g.Capacity("linux") != 4 {
		t.Fatalf("capacity %d (fold) %d (restored), want 4", f.Capacity("linux"), g.Capacity("linux"))
	}
}

// Only the admin may grant: a grant on an agent's (or any other role's)
// subject is refused before the fold.
func TestOnlyTheAdminGrants(t *testing.T) {
	g := &events.HostGranted{Host: "h1", At: t0, Pools: map[string]events.PoolGrant{"linux": {Slots: 9}}}
	for _, role := range events.Roles {
		_, err := events.Authorize(events.NewBy("x", role, t0, g))
		if (err == nil) != (role == events.RoleAdmin) {
			t.Errorf("a grant written as %s: err %v", role, err)
		}
	}
}
