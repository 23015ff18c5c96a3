package schemagen

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// Given the checked-in schemas/, when they are generated afresh from the Go
// types, then nothing differs: a changed event type must come with its
// regenerated schema (run `make schemas`).
func TestCheckedInSchemasAreCurrent(t *testing.T) {
	files, err := Files()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join("..", "..", "schemas")
	onDisk, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	if len(onDisk) != len(files) {
		t.Errorf("schemas/ has %d files, the catalogue makes %d: run `make schemas`", len(onDisk), len(files))
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("%s missing: run `make schemas`", name)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run `make schemas`", name)
		}
	}
}
