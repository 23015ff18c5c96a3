package vz

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/vmagent/backend"
)

// Limits of a macOS guest that the backend checks before it boots one
// (Virtualization.framework refuses a configuration outside them only at
// Validate, on a Mac; here they fail on any OS, with the shape named).
const (
	// MinGuestMemory is the least memory a macOS guest boots with.
	MinGuestMemory = 2 << 30
	// memoryUnit: the framework takes memory in whole MiB.
	memoryUnit = 1 << 20
)

// Machine is what one guest boots, resolved from its attempt's machine
// shape (events.Shape) over the backend's own settings: the shape's
// fields win, a zero field is the setting's. vz_darwin.go builds the VM
// configuration from it (CPUs, memory) and prepare clones the image's
// files and sizes the disk.
type Machine struct {
	// Image is the image's name ("" for the base image), BaseImage its
	// directory (disk.img, aux.img, hardware-model).
	Image     string
	BaseImage string
	// CPUs and MemoryBytes the guest gets.
	CPUs        uint
	MemoryBytes uint64
	// DiskBytes is the size disk.img is grown to after the clone (a raw
	// image grows sparse; the guest's daemon grows its APFS container);
	// 0 keeps the image's own size.
	DiskBytes int64
}

// MachineFor resolves the machine of an attempt whose pool declares shape
// (nil: none): CPUs and memory from the shape or Config.CPUs and
// Config.Memory; the image by name from Config.Images, or Config.BaseImage
// when the shape names none; the disk from the shape's disk_gib. A shape
// naming an image this host does not have, or a machine the framework
// cannot boot, is an error wrapping backend.ErrImage (the image, not the
// host, is what the attempt could not get): the message names the shape's
// values and the images the host has.
func (c Config) MachineFor(shape *events.Shape) (Machine, error) {
	m := Machine{BaseImage: c.BaseImage, CPUs: c.CPUs, MemoryBytes: c.Memory}
	if shape == nil {
		shape = &events.Shape{}
	}
	if shape.CPU > 0 {
		m.CPUs = uint(shape.CPU)
	}
	if shape.MemoryMiB > 0 {
		m.MemoryBytes = uint64(shape.MemoryMiB) * memoryUnit
	}
	if shape.DiskGiB > 0 {
		m.DiskBytes = int64(shape.DiskGiB) << 30
	}
	if shape.Image != "" {
		dir, ok := c.Images[shape.Image]
		if !ok {
			return Machine{}, fmt.Errorf("vz backend: the machine shape names image %q, which this host does not have (vz.images: %s): add it under backend.vz.images, or fix the shape's image: %w",
				shape.Image, imageNames(c.Images), backend.ErrImage)
		}
		m.Image, m.BaseImage = shape.Image, dir
	}
	switch {
	case m.CPUs == 0:
		return Machine{}, fmt.Errorf("vz backend: a guest needs at least 1 CPU (vz.cpus, or the shape's cpu): %w", backend.ErrImage)
	case m.MemoryBytes < MinGuestMemory:
		return Machine{}, fmt.Errorf("vz backend: memory %d MiB: a macOS guest needs at least %d MiB (vz.memory, or the shape's memory): %w",
			m.MemoryBytes/memoryUnit, MinGuestMemory/memoryUnit, backend.ErrImage)
	case m.MemoryBytes%memoryUnit != 0:
		return Machine{}, fmt.Errorf("vz backend: memory %d bytes is not a whole number of MiB, which the framework needs: %w", m.MemoryBytes, backend.ErrImage)
	}
	return m, nil
}

func imageNames(images map[string]string) string {
	if len(images) == 0 {
		return "none"
	}
	names := make([]string, 0, len(images))
	for n := range images {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// growDisk grows the clone's disk.img in dir to size bytes (0: as it is).
// A size below the image's is refused: a disk is never shrunk.
func growDisk(dir string, size int64) error {
	if size == 0 {
		return nil
	}
	disk := filepath.Join(dir, diskImageName)
	fi, err := os.Stat(disk)
	if err != nil {
		return fmt.Errorf("the machine shape sizes the disk, but the image has no %s: %w", diskImageName, err)
	}
	switch {
	case size < fi.Size():
		return fmt.Errorf("the machine shape's disk (%d GiB) is smaller than the image's %s (%d bytes): a disk is never shrunk; raise the shape's disk or leave it out: %w",
			size>>30, diskImageName, fi.Size(), backend.ErrImage)
	case size == fi.Size():
		return nil
	}
	return os.Truncate(disk, size)
}

// size is the CPUs and memory (bytes) guest g is given: its machine's
// (Create sets them from the shape), else cpus and memory, the defaults of
// the hypervisor or helper that boots it.
func (g Guest) size(cpus uint, memory uint64) (uint, uint64) {
	if g.CPUs > 0 {
		cpus = g.CPUs
	}
	if g.MemoryBytes > 0 {
		memory = g.MemoryBytes
	}
	return cpus, memory
}
