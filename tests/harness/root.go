// Package harness runs the whole Berth system in one process on the GitHub
// simulator: the demo and the end-to-end tests share it.
package harness

import (
	"errors"
	"os"
	"path/filepath"
)

// RepoRoot walks up from the working directory to the folder holding go.work.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.work not found above the working directory: run from inside the Berth repository")
		}
		dir = parent
	}
}

// FixturesDir is ../shared/fixtures/github next to the repository.
func FixturesDir(root string) (string, error) {
	dir := filepath.Join(root, "..", "shared", "fixtures", "github")
	if _, err := os.Stat(filepath.Join(dir, "webhooks")); err != nil {
		return "", errors.New("GitHub fixtures not found at " + dir + ": the shared folder must sit beside the repository (../shared)")
	}
	return dir, nil
}
