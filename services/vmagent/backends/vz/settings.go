package vz

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"time"

	"github.com/berth-ci/berth/services/bytesize"
	"github.com/berth-ci/berth/services/vmagent/backend"
)

// Kind is the name of the vz backend's section: `backend: {vz: ...}`.
const Kind = "vz"

// Settings is an agent's `backend: {vz: ...}` section: one macOS guest per
// attempt with Apple's Virtualization.framework, macOS hosts on Apple
// silicon only, at most 2 guests per host. The section is read and checked
// on any OS (a mac agent's config can be checked anywhere); the backend is
// built only where vz_darwin.go registers its constructor.
type Settings struct {
	// BaseImage is a directory holding the base guest (disk.img, aux.img,
	// hardware-model); required. Each attempt boots an APFS clone of it.
	BaseImage string `yaml:"base_image"`
	// ClonesRoot holds the per-attempt clones, on the same APFS volume as
	// BaseImage (default: <data_dir>/agents/<host>/vz).
	ClonesRoot string `yaml:"clones_root"`
	// Images are more base images by name (e.g. xcode-16:
	// /Users/Shared/berth/images/xcode-16), each a directory like
	// BaseImage: a machine shape's image picks one (pools.<p>.shapes.<s>.
	// image); a shape naming no image boots BaseImage.
	Images map[string]string `yaml:"images"`
	// CPUs and Memory per guest (default 4 and 8GiB), unless its machine
	// shape sets them.
	CPUs   uint          `yaml:"cpus"`
	Memory bytesize.Size `yaml:"memory"`
	// Steps: create bounds clone + boot + runner start (default 10m), stop
	// a whole stop (default 2m). Within a stop, StopGrace bounds the
	// guest's own shutdown (default 1m, at most half of what is left) and
	// ForceTimeout the forced one (default 30s).
	backend.Steps `yaml:",inline"`
	StopGrace     time.Duration `yaml:"stop_grace"`
	ForceTimeout  time.Duration `yaml:"force_timeout"`
}

// steps are vz's default deadlines: a macOS guest boots slowly.
var steps = backend.Steps{CreateTimeout: 10 * time.Minute, StopTimeout: 2 * time.Minute}

// kind is vz's registration; new is its constructor, nil off macOS.
func kind(new func(context.Context, backend.Settings, backend.Host) (backend.Backend, error)) backend.Kind {
	return backend.Kind{Name: Kind, Steps: steps, New: new,
		NewSettings: func() backend.Settings { return &Settings{} },
		Needs:       "macOS on Apple silicon, in a berth built with CGO_ENABLED=1 on darwin/arm64 (use the exec or ec2 backend here)"}
}

// Defaults implements backend.Settings.
func (v *Settings) Defaults(h backend.Host) {
	def(&v.ClonesRoot, filepath.Join(h.DataDir, "agents", h.Name, "vz"))
	def(&v.CPUs, 4)
	def(&v.Memory, 8<<30)
	def(&v.StopGrace, time.Minute)
	def(&v.ForceTimeout, 30*time.Second)
}

func def[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}

// Validate implements backend.Settings.
func (v *Settings) Validate(at string, h backend.Host, bad backend.Report) {
	if v.BaseImage == "" {
		bad("%s.base_image is required: the directory of the base macOS guest (disk.img, aux.img, hardware-model)", at)
	}
	if h.PhysicalCap > MaxPhysicalCap {
		bad("%s: physical_cap %d: a macOS host runs at most 2 guests; set physical_cap: 2 (or fewer slots)", at, h.PhysicalCap)
	}
	if v.Memory < MinGuestMemory {
		bad("%s.memory %v: give a macOS guest at least 2GiB", at, v.Memory)
	}
	for name, dir := range v.Images {
		if name == "" || dir == "" {
			bad("%s.images: %q: %q: give each image a name and the directory of its base guest", at, name, dir)
		}
	}
	v.checkShapes(at, h, bad)
	v.Steps.Check(at, bad)
}

// fromSettings builds the backend on the platform's hypervisor.
func fromSettings(_ context.Context, s backend.Settings, h backend.Host) (backend.Backend, error) {
	v, ok := s.(*Settings)
	if !ok {
		return nil, fmt.Errorf("vz backend: settings of type %T", s)
	}
	if platformHypervisor == nil {
		_, err := NewPlatformHypervisor(v.CPUs, uint64(v.Memory))
		return nil, err
	}
	// Each guest in a helper process of its own (`berth vz-guest`), so a
	// stop that wedges ends with the helper's SIGKILL, not the agent's.
	hv := &Helpers{CPUs: v.CPUs, Memory: uint64(v.Memory), Logger: h.Logger}
	return New(Config{BaseImage: v.BaseImage, Images: v.Images, CPUs: v.CPUs, Memory: uint64(v.Memory), ClonesRoot: v.ClonesRoot, PhysicalCap: h.PhysicalCap,
		RunnerTimeout: v.CreateTimeout, StopGrace: v.StopGrace, ForceTimeout: v.ForceTimeout}, hv)
}

// checkShapes resolves the machine of every pool the agent advertises
// (h.Shapes) as Create will, so a shape naming an image the section does
// not list, or too little memory, is refused when the config is read
// rather than at a job's boot.
func (v *Settings) checkShapes(at string, h backend.Host, bad backend.Report) {
	c := Config{BaseImage: v.BaseImage, Images: v.Images, CPUs: v.CPUs, Memory: uint64(v.Memory)}
	pools := make([]string, 0, len(h.Shapes))
	for p := range h.Shapes {
		pools = append(pools, p)
	}
	sort.Strings(pools)
	for _, p := range pools {
		if _, err := c.MachineFor(h.Shapes[p]); err != nil {
			bad("%s: pool %s: %v", at, p, err)
		}
	}
}
