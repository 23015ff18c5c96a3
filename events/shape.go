package events

import (
	"slices"
	"sort"
	"strings"
)

// Shape is the machine a pool's VMs get (issue 20): its resources and what
// it boots. A pool declares a default shape and named shapes; each named
// shape is advertised as a pool of its own (ShapePool), whose runner
// labels are the pool's plus the shape's selector labels, so a job's
// labels pick the pool and the shape by the usual match (law 8), and the
// runner GitHub gives the job has every label it asked for. Zero fields
// are unset: the backend's own default.
type Shape struct {
	CPU       int    `json:"cpu,omitempty"`
	MemoryMiB int    `json:"memory_mib,omitempty"`
	DiskGiB   int    `json:"disk_gib,omitempty"`
	Image     string `json:"image,omitempty"` // a vz image name, an AMI id, or what the exec commands take
	// InstanceTypes (EC2), in order of preference: they replace the
	// backend's list for this shape.
	InstanceTypes []string `json:"instance_types,omitempty"`
}

// Resources are what a host's physical capacity offers shapes: placement
// books a VM on a host only while the shapes of the VMs it holds, plus the
// new one, fit (HostFits). Zero fields are not counted.
type Resources struct {
	CPU       int `json:"cpu,omitempty"`
	MemoryMiB int `json:"memory_mib,omitempty"`
}

// ShapeLabelPrefix starts every label that selects a shape, such as
// berth-size-l or berth-image-xcode-16: a job that names one is served by a
// pool offering that shape, or by none (JobUnschedulable), never by a
// default shape.
const ShapeLabelPrefix = "berth-"

// IsShapeLabel reports whether l selects a shape.
func IsShapeLabel(l string) bool {
	return strings.HasPrefix(strings.ToLower(strings.TrimSpace(l)), ShapeLabelPrefix)
}

// ShapePool is the name of the pool a named shape of pool is advertised
// as: "<pool>-<shape>" (config refuses a name that collides).
func ShapePool(pool, shape string) string { return pool + "-" + shape }

// UnknownShape says why no pool serves a job that names shape labels while
// some pool serves its other labels: the reason names the labels and the
// shape labels those pools offer. ok is false when the job names no shape
// label, when a pool serves it, or when no pool serves even its other
// labels (then it is simply not Berth's job).
func UnknownShape(jobLabels []string, pools map[string][]string) (reason string, ok bool) {
	job := NormalizeLabels(jobLabels)
	var shapes, rest []string
	for _, l := range job {
		if IsShapeLabel(l) {
			shapes = append(shapes, l)
		} else {
			rest = append(rest, l)
		}
	}
	if len(shapes) == 0 || len(rest) == 0 || MatchPool(job, pools) != "" {
		return "", false
	}
	var near []string
	offered := map[string]bool{}
	for name, labels := range pools {
		if !Serves(labels, rest) {
			continue
		}
		near = append(near, name)
		for _, l := range NormalizeLabels(labels) {
			if IsShapeLabel(l) {
				offered[l] = true
			}
		}
	}
	if len(near) == 0 {
		return "", false
	}
	sort.Strings(near)
	known := make([]string, 0, len(offered))
	for l := range offered {
		known = append(known, l)
	}
	sort.Strings(known)
	if len(known) == 0 {
		known = []string{"none"}
	}
	return "no pool offers a machine shape with the labels " + strings.Join(shapes, ", ") +
		" (pools " + strings.Join(near, ", ") + " serve the job's other labels; their shape labels: " + strings.Join(known, ", ") +
		"): fix runs-on, or declare the shape under the pool's shapes in the agents' config", true
}

// HostFits reports whether one more VM of pool fits host h's resources,
// counting the shapes of every VM it has booked (Host.BookedIn) plus extra,
// VMs per pool booked in the same round and not yet folded. A host that
// declares no resources, or a pool with no shape, always fits.
func HostFits(h *Host, pool string, extra func(pool string) int) bool {
	if h.Resources == (Resources{}) {
		return true
	}
	want := h.Pools[pool].Shape
	if want == nil {
		return true
	}
	var cpu, mem int
	for p, ps := range h.Pools {
		n := h.BookedIn[p]
		if extra != nil {
			n += extra(p)
		}
		if ps.Shape != nil && n > 0 {
			cpu += n * ps.Shape.CPU
			mem += n * ps.Shape.MemoryMiB
		}
	}
	r := h.Resources
	return (r.CPU == 0 || cpu+want.CPU <= r.CPU) && (r.MemoryMiB == 0 || mem+want.MemoryMiB <= r.MemoryMiB)
}

func (s *Shape) clone() *Shape {
	if s == nil {
		return nil
	}
	c := *s
	c.InstanceTypes = slices.Clone(s.InstanceTypes)
	return &c
}
