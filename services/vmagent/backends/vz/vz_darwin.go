//go:build darwin && arm64 && cgo

// This is the only file that touches Virtualization.framework. It stays thin:
// it turns a Guest into a VM configuration and maps four calls onto
// github.com/Code-Hex/vz/v3; every decision is in vz.go, tested on any OS.
// Build and test it on a Mac: `make vz-test`.

package vz

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	vzfw "github.com/Code-Hex/vz/v3"
	"github.com/berth-ci/berth/services/vmagent/backend"
	"golang.org/x/sys/unix"
)

func init() {
	backend.Register(kind(fromSettings))
	platformClone = func(src, dst string) error { return unix.Clonefile(src, dst, unix.CLONE_NOFOLLOW) }
	platformHypervisor = func(cpus uint, memoryBytes uint64) (Hypervisor, error) {
		return &framework{cpus: cpus, memory: memoryBytes, vms: map[string]*vzfw.VirtualMachine{}}, nil
	}
}

// framework runs guests in this process: in berth, a helper process
// (`berth vz-guest`) holding one guest, which dies with it.
type framework struct {
	cpus   uint
	memory uint64
	mu     sync.Mutex
	vms    map[string]*vzfw.VirtualMachine
}

func (f *framework) vm(attempt string) *vzfw.VirtualMachine {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.vms[attempt]
}

// wait runs a blocking framework call, returning early when ctx ends.
func wait(ctx context.Context, fn func() error) error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *framework) Boot(ctx context.Context, g Guest) error {
	cfg, err := f.configure(g)
	if err != nil {
		return err
	}
	vm, err := vzfw.NewVirtualMachine(cfg)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.vms[g.Attempt] = vm
	f.mu.Unlock()
	return wait(ctx, func() error { return vm.Start() })
}

// configure builds a guest's VM configuration: a macOS platform from the
// guest's bundle, then one step per device group. Each step sets its
// devices on cfg; the order of the framework calls is the one Boot has
// always made.
func (f *framework) configure(g Guest) (*vzfw.VirtualMachineConfiguration, error) {
	boot, err := vzfw.NewMacOSBootLoader()
	if err != nil {
		return nil, err
	}
	platform, err := macPlatform(g)
	if err != nil {
		return nil, err
	}
	cpus, memory := g.size(f.cpus, f.memory) // the attempt's machine shape
	cfg, err := vzfw.NewVirtualMachineConfiguration(boot, cpus, memory)
	if err != nil {
		return nil, err
	}
	cfg.SetPlatformVirtualMachineConfiguration(platform)

	if err := attachStorage(cfg, g.Dir); err != nil {
		return nil, err
	}
	if err := attachNetwork(cfg); err != nil {
		return nil, err
	}
	if err := attachSharedFolder(cfg, g.SharedDir); err != nil {
		return nil, err
	}
	if err := attachConsole(cfg); err != nil {
		return nil, err
	}
	if err := attachEntropy(cfg); err != nil {
		return nil, err
	}

	if ok, err := cfg.Validate(); !ok || err != nil {
		return nil, fmt.Errorf("invalid VM configuration: %w", err)
	}
	return cfg, nil
}

// macPlatform is the guest's Mac identity: the hardware model of its base
// image, its own machine identifier (kept across boots of one clone), and
// its auxiliary storage.
func macPlatform(g Guest) (*vzfw.MacPlatformConfiguration, error) {
	hw, err := vzfw.NewMacHardwareModelWithDataPath(filepath.Join(g.Dir, hardwareModelName))
	if err != nil {
		return nil, fmt.Errorf("hardware model: %w", err)
	}
	id, err := machineID(g.MachineIDFile)
	if err != nil {
		return nil, fmt.Errorf("machine identifier: %w", err)
	}
	aux, err := vzfw.NewMacAuxiliaryStorage(filepath.Join(g.Dir, auxStorageName))
	if err != nil {
		return nil, fmt.Errorf("auxiliary storage: %w", err)
	}
	return vzfw.NewMacPlatformConfiguration(vzfw.WithMacHardwareModel(hw), vzfw.WithMacMachineIdentifier(id), vzfw.WithMacAuxiliaryStorage(aux))
}

// attachStorage gives the guest its bundle's cloned disk image, read-write, as its
// only block device.
func attachStorage(cfg *vzfw.VirtualMachineConfiguration, bundle string) error {
	disk, err := vzfw.NewDiskImageStorageDeviceAttachment(filepath.Join(bundle, diskImageName), false)
	if err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	block, err := vzfw.NewVirtioBlockDeviceConfiguration(disk)
	if err != nil {
		return err
	}
	cfg.SetStorageDevicesVirtualMachineConfiguration([]vzfw.StorageDeviceConfiguration{block})
	return nil
}

// attachNetwork gives the guest one NAT network device with a fresh random
// MAC address, so that two clones of one image never share an address.
func attachNetwork(cfg *vzfw.VirtualMachineConfiguration) error {
	nat, err := vzfw.NewNATNetworkDeviceAttachment()
	if err != nil {
		return err
	}
	nic, err := vzfw.NewVirtioNetworkDeviceConfiguration(nat)
	if err != nil {
		return err
	}
	mac, err := vzfw.NewRandomLocallyAdministeredMACAddress()
	if err != nil {
		return err
	}
	nic.SetMACAddress(mac)
	cfg.SetNetworkDevicesVirtualMachineConfiguration([]*vzfw.VirtioNetworkDeviceConfiguration{nic})
	return nil
}

// attachSharedFolder shares the guest's shared directory with it, writable, under
// the macOS automount tag as "berth": the guest finds what it needs there
// without mounting anything itself.
func attachSharedFolder(cfg *vzfw.VirtualMachineConfiguration, shared string) error {
	tag, err := vzfw.MacOSGuestAutomountTag()
	if err != nil {
		return err
	}
	fs, err := vzfw.NewVirtioFileSystemDeviceConfiguration(tag)
	if err != nil {
		return err
	}
	dir, err := vzfw.NewSharedDirectory(shared, false)
	if err != nil {
		return err
	}
	share, err := vzfw.NewMultipleDirectoryShare(map[string]*vzfw.SharedDirectory{"berth": dir})
	if err != nil {
		return err
	}
	fs.SetDirectoryShare(share)
	cfg.SetDirectorySharingDevicesVirtualMachineConfiguration([]vzfw.DirectorySharingDeviceConfiguration{fs})
	return nil
}

// attachConsole gives the guest a display, a keyboard and a pointer, as a
// macOS guest expects (and as an operator needs to look at one).
func attachConsole(cfg *vzfw.VirtualMachineConfiguration) error {
	gfx, err := vzfw.NewMacGraphicsDeviceConfiguration()
	if err != nil {
		return err
	}
	display, err := vzfw.NewMacGraphicsDisplayConfiguration(1920, 1080, 80)
	if err != nil {
		return err
	}
	gfx.SetDisplays(display)
	cfg.SetGraphicsDevicesVirtualMachineConfiguration([]vzfw.GraphicsDeviceConfiguration{gfx})
	kbd, err := vzfw.NewUSBKeyboardConfiguration()
	if err != nil {
		return err
	}
	cfg.SetKeyboardsVirtualMachineConfiguration([]vzfw.KeyboardConfiguration{kbd})
	ptr, err := vzfw.NewUSBScreenCoordinatePointingDeviceConfiguration()
	if err != nil {
		return err
	}
	cfg.SetPointingDevicesVirtualMachineConfiguration([]vzfw.PointingDeviceConfiguration{ptr})
	return nil
}

// attachEntropy gives the guest a virtio entropy source.
func attachEntropy(cfg *vzfw.VirtualMachineConfiguration) error {
	entropy, err := vzfw.NewVirtioEntropyDeviceConfiguration()
	if err != nil {
		return err
	}
	cfg.SetEntropyDevicesVirtualMachineConfiguration([]*vzfw.VirtioEntropyDeviceConfiguration{entropy})
	return nil
}

// machineID reads the guest's identifier, or makes and stores a fresh one.
func machineID(path string) (*vzfw.MacMachineIdentifier, error) {
	if _, err := os.Stat(path); err == nil {
		return vzfw.NewMacMachineIdentifierWithDataPath(path)
	}
	id, err := vzfw.NewMacMachineIdentifier()
	if err != nil {
		return nil, err
	}
	return id, os.WriteFile(path, id.DataRepresentation(), 0o600)
}

func (f *framework) RequestStop(ctx context.Context, attempt string) error {
	vm := f.vm(attempt)
	if vm == nil {
		return nil
	}
	return wait(ctx, func() error {
		ok, err := vm.RequestStop()
		if err == nil && !ok {
			err = errors.New("the guest did not accept the stop request")
		}
		return err
	})
}

func (f *framework) ForceStop(ctx context.Context, attempt string) error {
	vm := f.vm(attempt)
	if vm == nil {
		return nil
	}
	return wait(ctx, vm.Stop)
}

func (f *framework) DetachNetwork(ctx context.Context, attempt string) error {
	vm := f.vm(attempt)
	if vm == nil {
		return nil
	}
	return wait(ctx, func() error { _, err := detachNetwork(vm); return err })
}

// Drop forgets the guest's VM object, so the framework can free it and its
// disk attachment; in a helper process the process's exit follows.
func (f *framework) Drop(ctx context.Context, attempt string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.vms, attempt)
	return nil
}

func (f *framework) State(ctx context.Context, attempt string) (State, error) {
	vm := f.vm(attempt)
	if vm == nil {
		return StateAbsent, nil
	}
	switch vm.State() {
	case vzfw.VirtualMachineStateStopped:
		return StateStopped, nil
	case vzfw.VirtualMachineStateError:
		return StateError, nil
	case vzfw.VirtualMachineStateStarting, vzfw.VirtualMachineStateRestoring:
		return StateStarting, nil
	case vzfw.VirtualMachineStateStopping:
		return StateStopping, nil
	default: // running, paused, pausing, resuming, saving: on
		return StateRunning, nil
	}
}
