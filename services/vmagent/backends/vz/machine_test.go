package vz

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/vmagent/backend"
)

// The machine a guest boots is its shape's where the shape sets a field,
// the backend's settings where it does not; a shape naming an image the
// host lacks, or a machine the framework cannot boot, is the image's
// fault and says what to change.
func TestMachineForTakesTheShapeOverTheSettings(t *testing.T) {
	c := Config{BaseImage: "/img/base", CPUs: 4, Memory: 8 << 30, Images: map[string]string{"xcode-16": "/img/xcode-16"}}
	for _, tc := range []struct {
		name  string
		shape *events.Shape
		want  Machine
		err   string
	}{
		{"no shape: the settings", nil, Machine{BaseImage: "/img/base", CPUs: 4, MemoryBytes: 8 << 30}, ""},
		{"size l", &events.Shape{CPU: 8, MemoryMiB: 16384, DiskGiB: 120},
			Machine{BaseImage: "/img/base", CPUs: 8, MemoryBytes: 16 << 30, DiskBytes: 120 << 30}, ""},
		{"an image by name, sizes from the settings", &events.Shape{Image: "xcode-16"},
			Machine{Image: "xcode-16", BaseImage: "/img/xcode-16", CPUs: 4, MemoryBytes: 8 << 30}, ""},
		{"an image the host lacks", &events.Shape{Image: "xcode-17"}, Machine{}, `image "xcode-17", which this host does not have (vz.images: xcode-16)`},
		{"too little memory", &events.Shape{MemoryMiB: 1024}, Machine{}, "needs at least 2048 MiB"},
	} {
		got, err := c.MachineFor(tc.shape)
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("%s: MachineFor = %+v, %v; want %+v", tc.name, got, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, backend.ErrImage)):
			t.Errorf("%s: MachineFor error = %v; want one containing %q, wrapping ErrImage", tc.name, err, tc.err)
		}
	}
}

// Given a host with a second image, when an attempt of a shape naming it
// with CPUs, memory and a disk is created, then its guest is booted with
// the shape's CPUs and memory, from a clone of that image whose disk was
// grown to the shape's; an attempt without a shape boots the base image
// at the settings' size.
func TestCreateBootsTheAttemptsMachineShape(t *testing.T) {
	var xcode string
	fx := newFixture(t, func(c *Config) {
		xcode = filepath.Join(filepath.Dir(c.BaseImage), "xcode-16")
		must(t, os.MkdirAll(xcode, 0o755))
		must(t, os.WriteFile(filepath.Join(xcode, "disk.img"), []byte("xcode disk"), 0o644))
		must(t, os.WriteFile(filepath.Join(xcode, "aux.img"), []byte("xcode aux"), 0o644))
		c.Images = map[string]string{"xcode-16": xcode}
		c.CPUs, c.Memory = 4, 8<<30
	})
	fx.hv.set(func(f *fakeHV) { f.runnerAfter = 10 * time.Millisecond })

	vm := fx.vm("berth-50-1")
	vm.Shape = &events.Shape{CPU: 8, MemoryMiB: 16384, DiskGiB: 1, Image: "xcode-16"}
	must(t, fx.b.Create(deadline(t, 5*time.Second), vm))
	must(t, fx.b.Create(deadline(t, 5*time.Second), fx.vm("berth-51-1")))

	fx.hv.mu.Lock()
	shaped, plain := fx.hv.guests["berth-50-1"], fx.hv.guests["berth-51-1"]
	fx.hv.mu.Unlock()
	if shaped.CPUs != 8 || shaped.MemoryBytes != 16<<30 {
		t.Errorf("the shaped guest booted with %d CPUs, %d bytes; want 8, 16 GiB", shaped.CPUs, shaped.MemoryBytes)
	}
	if plain.CPUs != 4 || plain.MemoryBytes != 8<<30 {
		t.Errorf("the plain guest booted with %d CPUs, %d bytes; want the settings' 4, 8 GiB", plain.CPUs, plain.MemoryBytes)
	}
	aux, _ := os.ReadFile(filepath.Join(shaped.Dir, "aux.img"))
	disk, err := os.Stat(filepath.Join(shaped.Dir, "disk.img"))
	if string(aux) != "xcode aux" || err != nil || disk.Size() != 1<<30 {
		t.Errorf("the shaped clone: aux %q, disk %v (%v); want the xcode-16 image's, its disk grown to 1 GiB", aux, disk, err)
	}
	if base, _ := os.ReadFile(filepath.Join(plain.Dir, "disk.img")); string(base) != "disk bytes" {
		t.Errorf("the plain clone's disk = %q; want the base image's", base)
	}
	if fi, _ := os.Stat(filepath.Join(xcode, "disk.img")); fi.Size() != int64(len("xcode disk")) {
		t.Errorf("the image's own disk was grown (%d bytes): only the clone may be", fi.Size())
	}
}

// A shape that names an image the host lacks boots nothing, takes no
// place under the cap, and is charged to the image.
func TestCreateOfAnUnknownImageBootsNothing(t *testing.T) {
	fx := newFixture(t, nil)
	vm := fx.vm("berth-52-1")
	vm.Shape = &events.Shape{Image: "xcode-99"}
	err := fx.b.Create(deadline(t, 5*time.Second), vm)
	if backend.Culprit(err) != events.CulpritImage || fx.hv.count("boot") != 0 || len(fx.b.Live()) != 0 {
		t.Errorf("create = %v (culprit %s), boots %d, live %v; want the image's fault, no boot, no place taken",
			err, backend.Culprit(err), fx.hv.count("boot"), fx.b.Live())
	}
}

// A disk is grown, never shrunk: a shape's disk below the image's fails.
func TestGrowDiskNeverShrinks(t *testing.T) {
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "disk.img"), make([]byte, 4096), 0o600))
	if err := growDisk(dir, 1024); !errors.Is(err, backend.ErrImage) {
		t.Errorf("growDisk below the image's size = %v; want ErrImage", err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "disk.img")); fi.Size() != 4096 {
		t.Errorf("disk is %d bytes after a refused shrink; want 4096", fi.Size())
	}
}
