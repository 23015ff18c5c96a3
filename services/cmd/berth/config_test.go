package main

import (
	"bytes"
	"errors"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Given a config with a misspelt key, when any command that loads config
// starts with it, then it exits 2 (bad usage or config) before touching
// NATS, and stderr names the file, the line, the key and the suggestion.
func TestBadConfigExitsTwoNamingTheKey(t *testing.T) {
	gobin, err := osexec.LookPath("go")
	if err != nil {
		t.Skip("go is not on PATH")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "berth")
	if out, err := osexec.Command(gobin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build berth: %v\n%s", err, out)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("watchdog:\n  provison_timeout: 1m\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"dev"}, {"dispatcher"}, {"watchdog"}, {"agent", "--host", "h1"}} {
		t.Run(args[0], func(t *testing.T) {
			cmd := osexec.Command(bin, append(args, "--config", bad, "--nats", "nats://127.0.0.1:1")...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var exit *osexec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != exitUsage {
				t.Fatalf("exit: %v, want status %d\n%s", err, exitUsage, stderr.String())
			}
			want := bad + ":2: watchdog.provison_timeout: unknown key; did you mean provision_timeout?"
			if !strings.Contains(stderr.String(), want) {
				t.Errorf("stderr does not say %q:\n%s", want, stderr.String())
			}
		})
	}
}
