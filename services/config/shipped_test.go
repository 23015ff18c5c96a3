package config

import (
	"os"
	"path/filepath"
	"testing"
)

// Every Berth config the repository ships parses and validates: the
// compose stack's agent refused its pool's berth-compose label once
// machine shapes reserved the berth- prefix, and only the compose test,
// with images built, saw it.
func TestEveryShippedConfigParses(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "deploy", "compose", "berth*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join("..", "..", "deploy", "berth.dev.yaml"))
	if len(files) < 2 {
		t.Fatalf("found only %v", files)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Parse(b); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}
