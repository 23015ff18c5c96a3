package events

import (
	"strconv"
	"time"
)

// PoolSlots is what a host offers one pool: the runner labels of its VMs and
// how many jobs of the pool it runs at once.
type PoolSlots struct {
	Labels []string `json:"labels"`
	Slots  int      `json:"slots"`
	// Shape is the machine the pool's VMs get (shape.go); nil: the
	// backend's own.
	Shape *Shape `json:"shape,omitempty"`
	// Installation is the GitHub installation whose jobs the pool serves
	// (empty: the only, unnamed one); pools of different installations
	// may share labels and never serve each other's jobs.
	Installation string `json:"installation,omitempty"`
}

// HostOnline: an agent started and advertises its pools, slots, physical VM
// cap (a macOS host runs at most 2 guests) and the curve public key JIT
// configs are sealed to. Subject berth.evt.host.<host>; emitted by the agent
// at start, and again when it sees its host reported lost while it runs;
// key host + boot id + announcement time.
type HostOnline struct {
	Host        string               `json:"host"`
	Boot        string               `json:"boot"`
	Pools       map[string]PoolSlots `json:"pools"`
	PhysicalCap int                  `json:"physical_cap"`
	CurveKey    string               `json:"curve_key"`
	Backend     string               `json:"backend"`
	// Assign: the backend can boot a VM without a JIT config and hand it
	// one later, so the host can keep warm VMs (issue 8).
	Assign bool `json:"assign,omitempty"`
	// Resources the host's VMs share, counted by their pools' shapes
	// (HostFits); nil: only PhysicalCap counts.
	Resources *Resources `json:"resources,omitempty"`
	At        time.Time  `json:"at"`
}

func (HostOnline) EventType() string      { return TypeHostOnline }
func (e HostOnline) EventSubject() string { return HostSubject(e.Host) }
func (e HostOnline) EventID() string {
	return e.Host + "/online/" + e.Boot + "/" + strconv.FormatInt(e.At.UnixNano(), 10)
}

// HostChange is the shape of the operator and watchdog host facts.
type HostChange struct {
	Host   string    `json:"host"`
	Reason string    `json:"reason"`
	By     string    `json:"by,omitempty"`
	At     time.Time `json:"at"`
}

func (h HostChange) EventSubject() string { return HostSubject(h.Host) }
func (h HostChange) id(kind string) string {
	return h.Host + "/" + kind + "/" + strconv.FormatInt(h.At.UnixNano(), 10)
}

// HostDraining: the host takes no new placements and leaves when idle.
type HostDraining struct{ HostChange }

func (HostDraining) EventType() string { return TypeHostDraining }
func (e HostDraining) EventID() string { return e.id("draining") }

// HostLost: the host's heartbeat expired. The watchdog reacts by releasing
// every slot held on it.
type HostLost struct{ HostChange }

func (HostLost) EventType() string { return TypeHostLost }
func (e HostLost) EventID() string { return e.id("lost") }

// HostCordoned: no new placements on the host until uncordoned.
type HostCordoned struct{ HostChange }

func (HostCordoned) EventType() string { return TypeHostCordoned }
func (e HostCordoned) EventID() string { return e.id("cordoned") }

// HostUncordoned lifts a cordon.
type HostUncordoned struct{ HostChange }

func (HostUncordoned) EventType() string { return TypeHostUncordoned }
func (e HostUncordoned) EventID() string { return e.id("uncordoned") }

// HostDegraded: the watchdog saw repeated placement failures charged to the
// host, its image or its backend (Culprit) and marks it degraded (law 11):
// the dispatcher prefers healthy hosts and sends it at most one probe
// placement at a time, after an exponential back-off; the jobs keep their
// attempts. Subject berth.evt.host.<host>.watchdog; emitted by the
// watchdog; read by the dispatcher (placement), status and the pool
// alarm; key host + "degraded" + time. Failures is the run that tripped it.
type HostDegraded struct {
	HostChange
	Culprit  string `json:"culprit"`
	Failures int    `json:"failures"`
}

func (HostDegraded) EventType() string { return TypeHostDegraded }
func (e HostDegraded) EventID() string { return e.id("degraded") }

// HostRecovered lifts a degradation: a probe placement on the host
// succeeded (its create returned; for an image culprit, its runner ran a
// job). Subject berth.evt.host.<host>.watchdog; emitted by the watchdog;
// key host + "recovered" + time.
type HostRecovered struct{ HostChange }

func (HostRecovered) EventType() string { return TypeHostRecovered }
func (e HostRecovered) EventID() string { return e.id("recovered") }
