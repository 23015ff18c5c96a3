package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Given the example file shipped in deploy/, when it is loaded, then it is
// valid and its durations and defaults are what the comments promise.
func TestExampleConfigLoads(t *testing.T) {
	c, err := Load(filepath.Join("..", "..", "deploy", "berth.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Watchdog.ProvisionTimeout != 10*time.Minute || c.Agents[0].PhysicalCap != 2 || c.Agents[0].Pools["macos"].Slots != 2 {
		t.Errorf("unexpected values: %+v", c)
	}
}

// Given a file with several mistakes, when it is parsed, then every mistake
// is reported at once, each saying what to change.
func TestValidateReportsEveryProblem(t *testing.T) {
	_, err := Parse([]byte(`
dispatcher: {github: {scope: enterprise}}
agents:
  - host: "bad.name"
    pools: {linux: {slots: 0}}
    backend: {kind: exec}
  - host: dup
    pools: {a: {labels: [x], slots: 1}}
    backend: {kind: exec, exec: {create: [c], stop: [s]}}
  - host: dup
    pools: {a: {labels: [x], slots: 1}}
    backend: {kind: exec, exec: {create: [c], stop: [s]}}
`))
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"scope", "bad.name", "slots >= 1", "create and stop", "appears twice"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
}

// Given a secret named by an environment variable, Secret reads it; an
// inline value wins.
func TestSecretFromEnv(t *testing.T) {
	t.Setenv("BERTH_TEST_SECRET", "s3")
	if got := Secret("", "BERTH_TEST_SECRET"); got != "s3" {
		t.Errorf("got %q", got)
	}
	if got := Secret("inline", "BERTH_TEST_SECRET"); got != "inline" {
		t.Errorf("got %q", got)
	}
}

// A missing file says how to fix it.
func TestMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if err == nil || !strings.Contains(err.Error(), "berth.example.yaml") {
		t.Errorf("got %v", err)
	}
	_ = os.Remove
}

// Given no retention settings, the stream keeps facts for 30 days and has no
// size caps; the example file documents the same.
func TestRetentionDefaults(t *testing.T) {
	c, err := Parse([]byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	if c.NATS.StreamMaxAge() != 720*time.Hour || c.NATS.MaxBytes != 0 || c.NATS.MaxMsgs != 0 {
		t.Errorf("defaults: max_age %v, max_bytes %v, max_msgs %d; want 720h, 0, 0", c.NATS.StreamMaxAge(), c.NATS.MaxBytes, c.NATS.MaxMsgs)
	}
	ex, err := Load(filepath.Join("..", "..", "deploy", "berth.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if ex.NATS.StreamMaxAge() != c.NATS.StreamMaxAge() || ex.NATS.MaxBytes != 0 || ex.NATS.MaxMsgs != 0 {
		t.Errorf("example file: %+v, want the defaults", ex.NATS)
	}
}

// Given retention settings, when they are parsed, then sizes take units and
// 0s means no age limit.
func TestRetentionSettingsParse(t *testing.T) {
	c, err := Parse([]byte("nats: {max_age: 0s, max_bytes: 20GiB, max_msgs: 5000000}"))
	if err != nil {
		t.Fatal(err)
	}
	if c.NATS.StreamMaxAge() != 0 || c.NATS.MaxBytes != 20<<30 || c.NATS.MaxMsgs != 5_000_000 {
		t.Errorf("got max_age %v, max_bytes %v, max_msgs %d", c.NATS.StreamMaxAge(), c.NATS.MaxBytes, c.NATS.MaxMsgs)
	}
	for in, want := range map[string]ByteSize{"1073741824": 1 << 30, "512MiB": 512 << 20, "2 GB": 2e9, "100MiB": 100 << 20} {
		c, err := Parse([]byte("nats: {max_bytes: " + in + "}"))
		if err != nil || c.NATS.MaxBytes != want {
			t.Errorf("max_bytes %q: %v (%v), want %v", in, c.NATS.MaxBytes, err, want)
		}
	}
	if _, err := Parse([]byte("nats: {max_bytes: 10 potatoes}")); err == nil || !strings.Contains(err.Error(), "GiB") {
		t.Errorf("a size without a known unit: %v, want an error naming the units", err)
	}
}

// Given retention settings that would drop facts the services still need,
// when they are validated, then each is refused with what to change.
func TestRetentionValidation(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       []string // in the error; none: valid
	}{
		{"defaults", "{}", nil},
		{"no limits", "nats: {max_age: 0s}", nil},
		{"age just long enough", "nats: {max_age: 144h}", nil},
		{"age shorter than a job can live", "nats: {max_age: 48h}",
			[]string{"nats.max_age 48h0m0s is too short", "watchdog.max_job_duration", "144h0m0s or more"}},
		{"retention longer than jobs", "nats: {max_age: 200h}\nwatchdog: {max_job_duration: 24h, retention: 240h}",
			[]string{"watchdog.retention", "264h0m0s or more"}},
		{"duplicate window over max age", "nats: {max_age: 1s, duplicate_window: 2m}\nwatchdog: {max_job_duration: 1s, retention: 1s}",
			[]string{"duplicate_window 2m0s is longer than nats.max_age 1s"}},
		{"negative age", "nats: {max_age: -1h}", []string{"positive duration"}},
		{"tiny byte cap", "nats: {max_bytes: 1MiB}", []string{"nats.max_bytes 1MiB", "at least 100MiB"}},
		{"tiny count cap", "nats: {max_msgs: 1000}", []string{"nats.max_msgs 1000", "at least 100000"}},
		{"negative count cap", "nats: {max_msgs: -5}", []string{"nats.max_msgs -5"}},
		{"caps big enough", "nats: {max_bytes: 100MiB, max_msgs: 100000}", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q:\n%v", w, err)
				}
			}
		})
	}
}
