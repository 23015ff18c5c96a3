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
// buildBerth builds the berth command into a temporary directory.
func buildBerth(t *testing.T) (bin, dir string) {
	t.Helper()
	gobin, err := osexec.LookPath("go")
	if err != nil {
		t.Skip("go is not on PATH")
	}
	dir = t.TempDir()
	bin = filepath.Join(dir, "berth")
	if out, err := osexec.Command(gobin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build berth: %v\n%s", err, out)
	}
	return bin, dir
}

func TestBadConfigExitsTwoNamingTheKey(t *testing.T) {
	bin, dir := buildBerth(t)
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

// Given a command line with a mistake (an unknown subcommand, a positional
// argument a command does not take, a flag it does not have, a missing
// argument), when berth runs it, then it exits 2 (bad usage, as the README
// says) naming the mistake, before it tries to reach NATS: such mistakes
// exited 1, or were accepted in silence (issue 21's dead ends).
func TestUsageMistakesExitTwo(t *testing.T) {
	bin, _ := buildBerth(t)
	for _, args := range [][]string{{"nosuch"}, {"status", "extra"}, {"status", "--bogus"}, {"release"}, {"events", "--job", "1", "extra"}} {
		out, err := osexec.Command(bin, append(args, "--nats", "nats://127.0.0.1:1")...).CombinedOutput()
		var exit *osexec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != exitUsage {
			t.Errorf("berth %v: %v, want exit %d\n%s", args, err, exitUsage, out)
		}
	}
}
