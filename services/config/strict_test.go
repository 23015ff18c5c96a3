package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// agent is a valid exec agent, for files that add one mistake.
const agent = `agents:
  - host: h1
    pools: {linux: {labels: [self-hosted], slots: 1}}
    backend:
      exec: {create: [c], stop: [s]}
`

// loadBad writes body to a file, loads it, and returns the file's path and
// the mistakes Load reported.
func loadBad(t *testing.T, body string) (string, []*Error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if err == nil {
		t.Fatalf("Load accepted:\n%s", body)
	}
	var out []*Error
	for _, e := range unjoin(err) {
		var ce *Error
		if !errors.As(e, &ce) {
			t.Fatalf("a mistake that is not an *Error: %v", e)
		}
		out = append(out, ce)
	}
	return path, out
}

// Given a file with one mistake, when it is loaded, then the error names
// the file, the line, the full key and (for a misspelt key) the nearest
// known key, and its text says all of them.
func TestMistakesNameFileLineKeyAndSuggestion(t *testing.T) {
	for _, tc := range []struct {
		name, body   string
		line         int
		key, suggest string
		says         string
	}{
		{"misspelt top-level key", "data_dri: /tmp\n", 1, "data_dri", "data_dir", "unknown key"},
		{"misspelt nested key", "nats: {replicas: 1}\nwatchdog:\n  listen: 127.0.0.1:0\n  provison_timeout: 1m\n", 4,
			"watchdog.provison_timeout", "provision_timeout", "unknown key"},
		{"misspelt key in an agent", strings.Replace(agent, "    pools:", "    physcial_cap: 2\n    pools:", 1), 3,
			"agents[0].physcial_cap", "physical_cap", "unknown key"},
		{"misspelt key in a backend section", strings.Replace(agent, "stop: [s]", "stop: [s], create_timout: 1m", 1), 5,
			"agents[0].backend.exec.create_timout", "create_timeout", "unknown key"},
		{"misspelt backend", strings.Replace(agent, "exec: {", "exce: {", 1), 5, "agents[0].backend.exce", "exec", "unknown key"},
		{"wrong type", strings.Replace(agent, "    pools:", "    physical_cap: many\n    pools:", 1), 3,
			"agents[0].physical_cap", "", `"many" is not a whole number`},
		{"wrong type of duration", "watchdog:\n  host_ttl: soon\n", 2, "watchdog.host_ttl", "", "not a duration"},
		{"negative duration", "watchdog:\n  teardown_timeout: -5m\n", 2, "watchdog.teardown_timeout", "", "is negative"},
		{"negative cap", strings.Replace(agent, "    pools:", "    physical_cap: -1\n    pools:", 1), 3,
			"agents[0].physical_cap", "", "physical_cap -1"},
		{"negative abandoned cap", "watchdog:\n  abandoned_cap: -2\n", 2, "watchdog.abandoned_cap", "", "at least 1"},
		{"two backends", strings.Replace(agent, "exec: {create: [c], stop: [s]}", "exec: {create: [c], stop: [s]}\n      ec2: {region: us-east-1}", 1), 6,
			"agents[0].backend", "", "exec and ec2 sections given"},
		{"no backend", strings.Replace(agent, "    backend:\n      exec: {create: [c], stop: [s]}\n", "    backend: {}\n", 1), 4,
			"agents[0].backend", "", "no backend section: give one of ec2, exec, vz"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, errs := loadBad(t, tc.body)
			if len(errs) != 1 {
				t.Fatalf("want one mistake, got %d: %v", len(errs), errs)
			}
			e := errs[0]
			if e.File != path || e.Line != tc.line || e.Key != tc.key || e.Suggest != tc.suggest {
				t.Errorf("got file %q line %d key %q suggest %q; want %q %d %q %q", e.File, e.Line, e.Key, e.Suggest, path, tc.line, tc.key, tc.suggest)
			}
			text := e.Error()
			for _, want := range []string{path + ":", tc.key, tc.says} {
				if !strings.Contains(text, want) {
					t.Errorf("%q does not say %q", text, want)
				}
			}
			if tc.suggest != "" && !strings.Contains(text, "did you mean "+tc.suggest+"?") {
				t.Errorf("%q does not suggest %s", text, tc.suggest)
			}
		})
	}
}

// Given a misspelt key, the message reads as the operator will see it.
func TestUnknownKeyMessage(t *testing.T) {
	path, errs := loadBad(t, "watchdog:\n  provison_timeout: 1m\n")
	want := path + ":2: watchdog.provison_timeout: unknown key; did you mean provision_timeout?"
	if got := errs[0].Error(); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// Given a key nothing resembles, the error lists the keys known there.
func TestUnknownKeyWithoutNeighbourListsTheKnownOnes(t *testing.T) {
	_, errs := loadBad(t, "nats:\n  zzzzzzzz: 1\n")
	if errs[0].Suggest != "" || !strings.Contains(errs[0].Error(), "known here: creds_file, duplicate_window") {
		t.Errorf("got %v", errs[0])
	}
}

// Given several mistakes, when the file is loaded, then each is reported
// at its own line, decoding and validation alike.
func TestEveryMistakeAtItsLine(t *testing.T) {
	_, errs := loadBad(t, "nats:\n  replicaz: 3\n  max_msgs: 5\nwatchdog:\n  host_ttl: -1s\n")
	lines := map[int]string{}
	for _, e := range errs {
		lines[e.Line] = e.Key
	}
	want := map[int]string{2: "nats.replicaz", 3: "nats.max_msgs", 5: "watchdog.host_ttl"}
	for l, k := range want {
		if lines[l] != k {
			t.Errorf("line %d: got key %q, want %q (all: %v)", l, lines[l], k, errs)
		}
	}
}

// Given a key that is set twice in one section, it is refused.
func TestDuplicateKeyRefused(t *testing.T) {
	_, err := Parse([]byte("watchdog: {host_ttl: 1s, host_ttl: 2s}\n"))
	if err == nil || !strings.Contains(err.Error(), "host_ttl") {
		t.Errorf("got %v", err)
	}
}

// The suggestion is the nearest key by edit distance, and nothing when
// no key is close.
func TestNearest(t *testing.T) {
	known := []string{"provision_timeout", "registration_timeout", "teardown_timeout", "host_ttl"}
	for in, want := range map[string]string{"provison_timeout": "provision_timeout", "teardown_timout": "teardown_timeout",
		"host_tl": "host_ttl", "colour": ""} {
		if got := nearest(in, known); got != want {
			t.Errorf("nearest(%q) = %q, want %q", in, got, want)
		}
	}
}
