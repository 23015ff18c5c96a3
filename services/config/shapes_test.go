package config

import (
	"reflect"
	"strings"
	"testing"

	"github.com/berth-ci/berth/events"
)

// Given an agent whose pool declares a machine and two shapes, when the
// config is parsed, then the agent advertises the pool with its machine and
// each shape as a pool of its own, with the pool's labels plus the shape's,
// the shape's slots (or the pool's) and its machine in the log's units; the
// host's resources are advertised, and the physical cap defaults to every
// advertised slot.
func TestShapesAreAdvertisedAsPoolsOfTheirOwn(t *testing.T) {
	c, err := Parse([]byte(`
agents:
  - host: mac-1
    resources: {cpu: 12, memory: 32GiB}
    pools:
      macos:
        labels: [self-hosted, macOS]
        slots: 2
        cpu: 4
        memory: 8GiB
        shapes:
          l: {labels: [berth-size-l], slots: 1, cpu: 8, memory: 16GiB, disk: 100GiB}
          xcode-16: {labels: [Berth-Image-Xcode-16], image: xcode-16, instance_types: [mac2.metal]}
    backend: {kind: exec, exec: {create: [c], stop: [s]}}
`))
	if err != nil {
		t.Fatal(err)
	}
	a := c.Agents[0]
	got := a.AdvertisedPools()
	want := map[string]events.PoolSlots{
		"macos":   {Labels: []string{"macos", "self-hosted"}, Slots: 2, Shape: &events.Shape{CPU: 4, MemoryMiB: 8192}},
		"macos-l": {Labels: []string{"berth-size-l", "macos", "self-hosted"}, Slots: 1, Shape: &events.Shape{CPU: 8, MemoryMiB: 16384, DiskGiB: 100}},
		"macos-xcode-16": {Labels: []string{"berth-image-xcode-16", "macos", "self-hosted"}, Slots: 2,
			Shape: &events.Shape{Image: "xcode-16", InstanceTypes: []string{"mac2.metal"}}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("advertised\n%+v\nwant\n%+v", got, want)
	}
	if r := a.HostResources(); r == nil || *r != (events.Resources{CPU: 12, MemoryMiB: 32768}) {
		t.Errorf("resources %+v", r)
	}
	if a.PhysicalCap != 5 {
		t.Errorf("physical_cap defaulted to %d, want 5 (2 + 1 + 2 advertised slots)", a.PhysicalCap)
	}
}

// Given shapes that cannot work, when the config is parsed, then each is
// refused with what to change: a shape label without the berth- prefix, a
// berth- label on the pool itself, a shape whose advertised name another
// pool has, and a machine larger than the host's resources.
func TestImpossibleShapesAreRefused(t *testing.T) {
	_, err := Parse([]byte(`
agents:
  - host: mac-1
    resources: {cpu: 8}
    pools:
      macos:
        labels: [self-hosted, macos, berth-size-m]
        slots: 2
        shapes:
          l: {labels: [large], cpu: 16}
      macos-l: {labels: [self-hosted, other], slots: 1}
    backend: {kind: exec, exec: {create: [c], stop: [s]}}
`))
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		`"large": a shape's labels start with berth-`,
		`"berth-size-m" starts with berth-, which selects a machine shape`,
		`advertised as pool "macos-l", which another pool or shape`,
		"larger than the host's resources",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
}
