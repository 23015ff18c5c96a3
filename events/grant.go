package events

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"time"
)

// RoleAdmin is the operators' admin credential: the only role that may
// grant a host its pools (HostGranted), on berth.evt.host.<host>.admin.
const RoleAdmin Role = "admin"

// PoolGrant is what the admin lets a host offer one pool: exactly these
// runner labels (normalized, NormalizeLabels) and at most Slots slots.
type PoolGrant struct {
	Labels []string `json:"labels"`
	Slots  int      `json:"slots"`
	// Installation: the GitHub installation the pool may serve (a host
	// cannot take another installation's jobs by claiming it).
	Installation string `json:"installation,omitempty"`
}

// HostGranted: the admin says what a host may offer (law 10: a host's
// announcement is its own word; what it may serve is the operators').
// Every fold offers a host only the intersection of its claim (HostOnline)
// and its newest grant (HostGrantOffer). No pools: the grant is revoked
// and the host is offered nothing. PhysicalCap caps the host's VMs; 0
// means the sum of the granted slots. Subject
// berth.evt.host.<host>.admin; emitted by `berth trust host` and `berth
// stream apply --grant-agents` (and `berth dev` for its own agents); read
// by every fold; key host + "granted" + time.
type HostGranted struct {
	Host        string               `json:"host"`
	Pools       map[string]PoolGrant `json:"pools"`
	PhysicalCap int                  `json:"physical_cap"`
	By          string               `json:"by,omitempty"`
	At          time.Time            `json:"at"`
}

func (HostGranted) EventType() string      { return TypeHostGranted }
func (e HostGranted) EventSubject() string { return HostSubject(e.Host) }
func (e HostGranted) EventID() string {
	return e.Host + "/granted/" + strconv.FormatInt(e.At.UnixNano(), 10)
}

// Cap is the grant's physical cap: PhysicalCap, or the sum of its slots.
func (g HostGranted) Cap() int {
	if g.PhysicalCap > 0 {
		return g.PhysicalCap
	}
	n := 0
	for _, p := range g.Pools {
		n += p.Slots
	}
	return n
}

// GrantFor grants host exactly what it would claim with pools and
// physical cap: the admin's grant for an agent of a known config.
func GrantFor(host string, pools map[string]PoolSlots, physicalCap int, by string, at time.Time) HostGranted {
	g := HostGranted{Host: host, Pools: map[string]PoolGrant{}, PhysicalCap: physicalCap, By: by, At: at}
	for name, ps := range pools {
		g.Pools[name] = PoolGrant{Labels: NormalizeLabels(ps.Labels), Slots: ps.Slots, Installation: ps.Installation}
	}
	return g
}

// GrantClaim grants exactly what o claims (tests and `berth dev`).
func GrantClaim(o HostOnline) HostGranted {
	return GrantFor(o.Host, o.Pools, o.PhysicalCap, "admin", o.At)
}

// Offer is what a fold offers a host that claims pools and physicalCap
// under grant g (nil: no grant): each claimed pool that g grants with
// exactly the claimed labels, its slots capped at the grant's, and the
// cap capped at g's. over says, sorted, each way the claim exceeds the
// grant (empty: it does not); a host with no grant is offered nothing.
func Offer(claim map[string]PoolSlots, physicalCap int, g *HostGranted) (pools map[string]PoolSlots, capped int, over []string) {
	pools = map[string]PoolSlots{}
	if g == nil {
		if len(claim) > 0 || physicalCap > 0 {
			over = append(over, "no grant: an admin has not granted this host any pool")
		}
		return pools, 0, over
	}
	for _, name := range slices.Sorted(maps.Keys(claim)) {
		c := claim[name]
		gp, ok := g.Pools[name]
		switch {
		case !ok:
			over = append(over, fmt.Sprintf("pool %s is not granted", name))
		case !slices.Equal(NormalizeLabels(c.Labels), gp.Labels):
			over = append(over, fmt.Sprintf("pool %s claims labels %v, granted %v", name, NormalizeLabels(c.Labels), gp.Labels))
		case c.Installation != gp.Installation:
			over = append(over, fmt.Sprintf("pool %s claims installation %q, granted %q", name, c.Installation, gp.Installation))
		default:
			if c.Slots > gp.Slots {
				over = append(over, fmt.Sprintf("pool %s claims %d slots, granted %d", name, c.Slots, gp.Slots))
			}
			pools[name] = PoolSlots{Labels: gp.Labels, Slots: min(c.Slots, gp.Slots), Shape: c.Shape.clone(), Installation: gp.Installation}
		}
	}
	capped = min(physicalCap, g.Cap())
	if physicalCap > g.Cap() {
		over = append(over, fmt.Sprintf("physical cap %d, granted %d", physicalCap, g.Cap()))
	}
	sort.Strings(over)
	return pools, capped, over
}

// offer recomputes what the fold offers h from its claim and its grant:
// h.Pools, h.PhysicalCap and h.Overclaim.
func (f *Fleet) offer(h *Host) {
	h.Pools, h.PhysicalCap, h.Overclaim = Offer(h.Claim, h.ClaimCap, h.Grant)
	f.markHost(h.Name)
	f.poolsChanged()
}

// OverclaimCommand is the admin's command that grants host what it
// claims, if the claim is right: what a host_overclaim alarm tells.
func OverclaimCommand(host string) string {
	return "berth --nats-nkey admin.nk trust host " + host + " --config berth.yaml"
}
