package config

import (
	"path/filepath"
	"time"
)

// VZ runs one macOS guest per attempt with Apple's Virtualization.framework
// (see services/vmagent/backends/vz): macOS hosts on Apple silicon only, at
// most 2 guests per host.
type VZ struct {
	// BaseImage is a directory holding the base guest (disk.img, aux.img,
	// hardware-model); required. Each attempt boots an APFS clone of it.
	BaseImage string `yaml:"base_image"`
	// ClonesRoot holds the per-attempt clones, on the same APFS volume as
	// BaseImage (default: <data_dir>/agents/<host>/vz).
	ClonesRoot string `yaml:"clones_root"`
	// CPUs and Memory per guest (default 4 and 8GiB).
	CPUs   uint     `yaml:"cpus"`
	Memory ByteSize `yaml:"memory"`
	// CreateTimeout bounds clone + boot + runner start (default 10m);
	// StopTimeout a whole stop (default 2m). Within a stop, StopGrace bounds
	// the guest's own shutdown (default 1m, at most half of what is left)
	// and ForceTimeout the forced one (default 30s). RetryBase means what
	// it means for exec.
	CreateTimeout time.Duration `yaml:"create_timeout"`
	StopTimeout   time.Duration `yaml:"stop_timeout"`
	StopGrace     time.Duration `yaml:"stop_grace"`
	ForceTimeout  time.Duration `yaml:"force_timeout"`
	RetryBase     time.Duration `yaml:"retry_base"`
}

// IsZero reports whether no vz setting was given.
func (v VZ) IsZero() bool { return v == VZ{} }

// defaults fills v for the agent on host, with the config's data dir.
func (v *VZ) defaults(dataDir, host string) {
	or(&v.ClonesRoot, filepath.Join(dataDir, "agents", host, "vz"))
	or(&v.CPUs, 4)
	or(&v.Memory, 8<<30)
	or(&v.CreateTimeout, 10*time.Minute)
	or(&v.StopTimeout, 2*time.Minute)
	or(&v.StopGrace, time.Minute)
	or(&v.ForceTimeout, 30*time.Second)
}

// validate reports each problem of the vz section of agent a at where.
func (v VZ) validate(where string, a Agent, bad func(string, ...any)) {
	if v.BaseImage == "" {
		bad("%s.base_image is required: the directory of the base macOS guest (disk.img, aux.img, hardware-model)", where)
	}
	if a.PhysicalCap > 2 {
		bad("%s: physical_cap %d: a macOS host runs at most 2 guests; set physical_cap: 2 (or fewer slots)", where, a.PhysicalCap)
	}
	if v.Memory < 2<<30 {
		bad("%s.memory %v: give a macOS guest at least 2GiB", where, v.Memory)
	}
	if len(a.Backend.Exec.Create)+len(a.Backend.Exec.Stop)+len(a.Backend.Exec.List) > 0 || !a.Backend.EC2.IsZero() {
		bad("%s: kind is vz but exec commands or an ec2 section are given: an agent runs one backend, remove the others", where)
	}
}
