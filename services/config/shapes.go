package config

import (
	"fmt"
	"slices"

	"github.com/berth-ci/berth/events"
)

// Machine is what a VM of a pool or shape gets (issue 20); every field is
// optional, and an unset one is the backend's own setting.
type Machine struct {
	// CPU and Memory are counted against the agent's resources at
	// placement, and given to backends that size VMs (exec: BERTH_CPU,
	// BERTH_MEMORY_MIB).
	CPU    int      `yaml:"cpu"`
	Memory ByteSize `yaml:"memory"`
	Disk   ByteSize `yaml:"disk"`
	// Image is what the VM boots: an AMI id for ec2, an image name the
	// exec commands take (BERTH_IMAGE).
	Image string `yaml:"image"`
	// InstanceTypes (ec2) replace the backend's instance_types.
	InstanceTypes []string `yaml:"instance_types"`
}

// Shape is a named machine shape of a pool (pools.<pool>.shapes.<name>),
// advertised as the pool "<pool>-<name>" whose runner labels are the
// pool's plus Labels: a job whose runs-on has the pool's labels and the
// shape's gets this machine.
type Shape struct {
	// Labels select the shape; each starts with berth- (berth-size-l,
	// berth-image-xcode-16), so that a job naming a shape no pool offers
	// is refused (unschedulable) rather than served by the default.
	Labels []string `yaml:"labels"`
	// Slots is how many jobs of the shape the host runs at once (default:
	// the pool's slots); the physical cap and resources bound them all.
	Slots   int `yaml:"slots"`
	Machine `yaml:",inline"`
}

// Resources are what an agent's VMs share (agents[].resources).
type Resources struct {
	CPU    int      `yaml:"cpu"`
	Memory ByteSize `yaml:"memory"`
}

// AdvertisedPools is what the agent offers: each pool with its machine,
// and each named shape as a pool of its own (events.ShapePool).
func (a Agent) AdvertisedPools() map[string]events.PoolSlots {
	out := map[string]events.PoolSlots{}
	for name, p := range a.Pools {
		out[name] = events.PoolSlots{Labels: events.NormalizeLabels(p.Labels), Slots: p.Slots, Shape: p.Machine.shape(), Installation: p.Installation}
		for sname, s := range p.Shapes {
			slots := s.Slots
			if slots == 0 {
				slots = p.Slots
			}
			labels := events.NormalizeLabels(append(slices.Clone(p.Labels), s.Labels...))
			out[events.ShapePool(name, sname)] = events.PoolSlots{Labels: labels, Slots: slots, Shape: s.Machine.shape(), Installation: p.Installation}
		}
	}
	return out
}

// HostResources is the agent's resources as it advertises them, nil when
// unset.
func (a Agent) HostResources() *events.Resources {
	if a.Resources == (Resources{}) {
		return nil
	}
	return &events.Resources{CPU: a.Resources.CPU, MemoryMiB: mib(a.Resources.Memory)}
}

func (m Machine) shape() *events.Shape {
	if m.CPU == 0 && m.Memory == 0 && m.Disk == 0 && m.Image == "" && len(m.InstanceTypes) == 0 {
		return nil
	}
	return &events.Shape{CPU: m.CPU, MemoryMiB: mib(m.Memory), DiskGiB: int((m.Disk + 1<<30 - 1) >> 30),
		Image: m.Image, InstanceTypes: slices.Clone(m.InstanceTypes)}
}

// mib rounds a size up to whole MiB.
func mib(b ByteSize) int { return int((b + 1<<20 - 1) >> 20) }

// validateShapes checks agent a's machines and shapes (at names it):
// selector labels that start with berth-, advertised names that are valid
// and unique, and shapes that fit the host's resources at all.
func validateShapes(at string, a Agent, bad func(string, ...any)) {
	names := map[string]bool{}
	for name := range a.Pools {
		names[name] = true
	}
	r := a.Resources
	if r.CPU < 0 || r.Memory < 0 {
		bad("%s.resources: cpu and memory cannot be negative", at)
	}
	for name, p := range a.Pools {
		// A pool with shapes keeps berth- labels for them; one without may
		// use a berth- label as its own selector (compose's berth-compose),
		// which then reads as the one shape it offers.
		for _, l := range p.Labels {
			if events.IsShapeLabel(l) && len(p.Shapes) > 0 {
				bad("%s.pools.%s.labels: %q starts with %s, which selects a machine shape: declare it under pools.%s.shapes.<name>.labels",
					at, name, l, events.ShapeLabelPrefix, name)
			}
		}
		checkMachine(fmt.Sprintf("%s.pools.%s", at, name), p.Machine, r, bad)
		for sname, s := range p.Shapes {
			key := fmt.Sprintf("%s.pools.%s.shapes.%s", at, name, sname)
			pool := events.ShapePool(name, sname)
			if err := events.ValidName("pool", pool); err != nil {
				bad("%s: %w", key, err)
			}
			if names[pool] {
				bad("%s: advertised as pool %q, which another pool or shape of this agent already is: rename one", key, pool)
			}
			names[pool] = true
			if len(s.Labels) == 0 || s.Slots < 0 {
				bad("%s: give labels that select the shape (e.g. [berth-size-l]) and slots >= 0 (0: the pool's)", key)
			}
			for _, l := range s.Labels {
				if !events.IsShapeLabel(l) {
					bad("%s.labels: %q: a shape's labels start with %s (e.g. berth-size-l, berth-image-xcode-16), so that a job asking for a shape no pool offers is refused, not served by another",
						key, l, events.ShapeLabelPrefix)
				}
			}
			checkMachine(key, s.Machine, r, bad)
		}
	}
}

// checkMachine refuses negative sizes and a machine the host's resources
// could never hold.
func checkMachine(key string, m Machine, r Resources, bad func(string, ...any)) {
	if m.CPU < 0 || m.Memory < 0 || m.Disk < 0 {
		bad("%s: cpu, memory and disk cannot be negative", key)
	}
	if (r.CPU > 0 && m.CPU > r.CPU) || (r.Memory > 0 && m.Memory > r.Memory) {
		bad("%s: the machine (cpu %d, memory %v) is larger than the host's resources (cpu %d, memory %v): no job of it could ever be placed",
			key, m.CPU, m.Memory, r.CPU, r.Memory)
	}
}
