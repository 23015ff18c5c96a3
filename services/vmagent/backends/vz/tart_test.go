package vz

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func tartDir(t *testing.T, config string) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "tart-vm")
	must(t, os.MkdirAll(src, 0o755))
	must(t, os.WriteFile(filepath.Join(src, "config.json"), []byte(config), 0o644))
	must(t, os.WriteFile(filepath.Join(src, "disk.img"), []byte("raw disk"), 0o644))
	must(t, os.WriteFile(filepath.Join(src, "nvram.bin"), []byte("aux storage"), 0o644))
	return src
}

func TestATartVMBecomesABaseImage(t *testing.T) {
	// Given a Tart macOS VM directory.
	hw := base64.StdEncoding.EncodeToString([]byte("hardware model bytes"))
	src := tartDir(t, `{"version":1,"os":"darwin","arch":"arm64","cpuCount":4,"memorySize":8589934592,
		"ecid":"`+base64.StdEncoding.EncodeToString([]byte("the base's own id"))+`","hardwareModel":"`+hw+`","macAddress":"7e:1f:00:00:00:01"}`)
	dst := filepath.Join(t.TempDir(), "images", "macos-15")

	// When it is imported.
	must(t, ImportTart(src, dst, nil))

	// Then the base image holds the disk, the auxiliary storage and the
	// decoded hardware model, and no machine identifier (each clone gets
	// its own).
	for name, want := range map[string]string{"disk.img": "raw disk", "aux.img": "aux storage", "hardware-model": "hardware model bytes"} {
		got, err := os.ReadFile(filepath.Join(dst, name))
		if err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", name, got, err, want)
		}
	}
	entries, _ := os.ReadDir(dst)
	if len(entries) != 3 {
		t.Errorf("base image holds %d files, want 3 (no machine-id, no config.json)", len(entries))
	}
	// And a backend boots clones of it.
	if _, err := New(Config{BaseImage: dst, ClonesRoot: t.TempDir()}, newFake(t)); err != nil {
		t.Fatal(err)
	}

	// And importing over an existing directory is refused.
	if err := ImportTart(src, dst, nil); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("a second import into %s = %v; want a refusal", dst, err)
	}
}

func TestImportTartRefusesWhatCannotBoot(t *testing.T) {
	hw := base64.StdEncoding.EncodeToString([]byte("hw"))
	for name, tc := range map[string]struct{ config, want string }{
		"a Linux VM":      {`{"os":"linux","arch":"arm64"}`, "darwin/arm64"},
		"an ASIF disk":    {`{"os":"darwin","arch":"arm64","diskFormat":"asif","hardwareModel":"` + hw + `"}`, "--disk-format=raw"},
		"no hardware":     {`{"os":"darwin","arch":"arm64"}`, "hardwareModel"},
		"not JSON at all": {`not json`, "config.json"},
	} {
		t.Run(name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "base")
			err := ImportTart(tartDir(t, tc.config), dst, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ImportTart = %v; want an error naming %q", err, tc.want)
			}
			if _, statErr := os.Stat(dst); !os.IsNotExist(statErr) {
				t.Errorf("a refused import left %s", dst)
			}
		})
	}
	if err := ImportTart(t.TempDir(), filepath.Join(t.TempDir(), "b"), nil); err == nil || !strings.Contains(err.Error(), "not a Tart VM") {
		t.Errorf("import of an empty directory = %v", err)
	}
}
