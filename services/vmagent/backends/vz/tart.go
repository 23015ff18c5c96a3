package vz

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Files of a Tart VM directory (github.com/cirruslabs/tart, ~/.tart/vms/<name>).
const (
	tartConfig = "config.json"
	tartDisk   = "disk.img"
	tartNVRAM  = "nvram.bin"
)

// tartVM is what ImportTart reads of a Tart VM's config.json: the platform
// and the base64 hardware model (its "ecid", the machine identifier, is
// left behind: each clone gets its own).
type tartVM struct {
	OS            string `json:"os"`
	Arch          string `json:"arch"`
	HardwareModel string `json:"hardwareModel"`
	DiskFormat    string `json:"diskFormat"`
}

// ImportTart makes dst, which must not exist, a base image (disk.img,
// aux.img, hardware-model) from the Tart VM directory src: its disk.img
// and nvram.bin (the auxiliary storage) cloned with clone (nil: the
// platform's: APFS clonefile on darwin), its hardware model decoded from
// config.json. dst appears whole or not at all.
func ImportTart(src, dst string, clone func(src, dst string) error) error {
	if clone == nil {
		clone = platformClone
	}
	if clone == nil {
		clone = copyFile
	}
	raw, err := os.ReadFile(filepath.Join(src, tartConfig))
	if err != nil {
		return fmt.Errorf("%s is not a Tart VM directory (tart get NAME; ~/.tart/vms/NAME): %w", src, err)
	}
	var vm tartVM
	if err := json.Unmarshal(raw, &vm); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(src, tartConfig), err)
	}
	if vm.OS != "darwin" || vm.Arch != "arm64" {
		return fmt.Errorf("%s is a %s/%s VM; the vz backend boots macOS guests on Apple silicon (darwin/arm64)", src, vm.OS, vm.Arch)
	}
	if vm.DiskFormat != "" && vm.DiskFormat != "raw" {
		return fmt.Errorf("%s has a %s disk; berth boots raw disk images: create the Tart VM with --disk-format=raw", src, vm.DiskFormat)
	}
	hw, err := base64.StdEncoding.DecodeString(vm.HardwareModel)
	if err != nil || len(hw) == 0 {
		return fmt.Errorf("%s: hardwareModel is missing or not base64 (%v): is it a macOS VM made by tart create --from-ipsw?", filepath.Join(src, tartConfig), err)
	}
	if _, err := os.Stat(dst); !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%s exists: import into a new directory (err %v)", dst, err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dst), tmpClonePrefix+"import-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	for from, to := range map[string]string{tartDisk: diskImageName, tartNVRAM: auxStorageName} {
		if err := clone(filepath.Join(src, from), filepath.Join(tmp, to)); err != nil {
			return fmt.Errorf("clone %s: %w", from, err)
		}
	}
	if err := os.WriteFile(filepath.Join(tmp, hardwareModelName), hw, 0o644); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}
