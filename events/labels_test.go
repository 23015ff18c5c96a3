package events_test

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/berth-ci/berth/events"
	"pgregory.net/rapid"
)

func TestNormalizeLabels(t *testing.T) {
	tests := []struct {
		name string
		in   []string
		want []string
	}{
		{"nil gives empty", nil, []string{}},
		{"lower-cases", []string{"Self-Hosted", "MACOS"}, []string{"macos", "self-hosted"}},
		{"trims", []string{"  linux\t", "\nx64 "}, []string{"linux", "x64"}},
		{"drops blanks", []string{"", "   ", "linux"}, []string{"linux"}},
		{"deduplicates after folding case", []string{"Linux", "linux", " LINUX "}, []string{"linux"}},
		{"sorts", []string{"x64", "linux", "self-hosted"}, []string{"linux", "self-hosted", "x64"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := append([]string(nil), tt.in...)
			got := events.NormalizeLabels(tt.in)
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("NormalizeLabels(%q) = %q, want %q", tt.in, got, tt.want)
			}
			if !reflect.DeepEqual(in, tt.in) {
				t.Fatalf("NormalizeLabels mutated its input: %q, was %q", tt.in, in)
			}
		})
	}
}

func TestLabelKeyIsCanonicalPerLabelSet(t *testing.T) {
	a := events.LabelKey([]string{"macOS", "self-hosted", "ARM64"})
	b := events.LabelKey([]string{" arm64", "Self-Hosted", "macos", "macos"})
	if a != b || a != "arm64,macos,self-hosted" {
		t.Fatalf("LabelKey gives %q and %q, want both %q", a, b, "arm64,macos,self-hosted")
	}
}

func TestServes(t *testing.T) {
	runner := []string{"self-hosted", "macOS", "ARM64"}
	tests := []struct {
		name   string
		runner []string
		job    []string
		want   bool
	}{
		{"exact set", runner, []string{"self-hosted", "macOS", "ARM64"}, true},
		{"subset", runner, []string{"self-hosted", "macos"}, true},
		{"case-insensitive both ways", []string{"SELF-HOSTED", "linux"}, []string{"Self-Hosted", "LINUX"}, true},
		{"job labels with spaces", runner, []string{" arm64 ", "MACOS"}, true},
		{"runner labels with spaces", []string{" linux ", "x64"}, []string{"linux"}, true},
		{"duplicate job labels", runner, []string{"macos", "MacOS"}, true},
		{"missing one label", runner, []string{"self-hosted", "macos", "x64"}, false},
		{"superset of runner", []string{"linux"}, []string{"linux", "self-hosted"}, false},
		{"empty job labels match nothing", runner, nil, false},
		{"blank job labels match nothing", runner, []string{"", "  "}, false},
		{"no runner labels", nil, []string{"linux"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := events.Serves(tt.runner, tt.job); got != tt.want {
				t.Fatalf("Serves(%q, %q) = %v, want %v", tt.runner, tt.job, got, tt.want)
			}
		})
	}
}

func TestMatchPool(t *testing.T) {
	pools := map[string][]string{
		"linux":       {"self-hosted", "linux"},
		"linux-x64":   {"self-hosted", "linux", "x64"},
		"linux-gpu":   {"self-hosted", "linux", "x64", "gpu"},
		"macos":       {"self-hosted", "macOS", "arm64"},
		"macos-b":     {"self-hosted", "macos", "ARM64"},
		"macos-xcode": {"self-hosted", "macos", "arm64", "xcode-16"},
	}
	tests := []struct {
		name  string
		job   []string
		pools map[string][]string
		want  string
	}{
		{"fewest labels wins", []string{"self-hosted", "linux"}, pools, "linux"},
		{"only the bigger pool has x64", []string{"linux", "x64"}, pools, "linux-x64"},
		{"only one pool has gpu", []string{"gpu"}, pools, "linux-gpu"},
		{"tie broken by name", []string{"macos", "arm64"}, pools, "macos"},
		{"specific label narrows the match", []string{"XCODE-16"}, pools, "macos-xcode"},
		{"case-insensitive", []string{"Self-Hosted", "LINUX"}, pools, "linux"},
		{"no pool serves", []string{"windows"}, pools, ""},
		{"empty job labels", nil, pools, ""},
		{"no pools", []string{"linux"}, nil, ""},
		{"duplicate pool labels do not make a pool less specific",
			[]string{"linux"},
			map[string][]string{"a": {"linux", "x64"}, "b": {"Linux", "linux", "LINUX"}}, "b"},
		{"tie broken by name, whatever the label order",
			[]string{"linux"},
			map[string][]string{"zeta": {"linux", "x64"}, "alpha": {"X64", "Linux"}}, "alpha"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Map iteration order is random: ask several times.
			for i := 0; i < 20; i++ {
				if got := events.MatchPool(tt.job, tt.pools); got != tt.want {
					t.Fatalf("MatchPool(%q) = %q, want %q", tt.job, got, tt.want)
				}
			}
		})
	}
}

// The Matcher answers exactly as MatchPool for any jobs and pools, given
// raw labels (Match) or a job as the fold keeps it (MatchJob), whose labels
// and label key come from the queued fact.
func TestMatcherAgreesWithMatchPool(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		vocab := []string{"self-hosted", "linux", "Linux", "x64", "ARM64", "macos", "gpu", " linux "}
		labels := rapid.SliceOfN(rapid.SampledFrom(vocab), 0, 4)
		pools := rapid.MapOfN(rapid.StringMatching(`[a-c]`), labels, 0, 3).Draw(t, "pools")
		m := events.NewMatcher(pools)
		f := events.NewFleet()
		for i := int64(1); i <= 5; i++ {
			job := labels.Draw(t, "job")
			want := events.MatchPool(job, pools)
			if got := m.Match(job); got != want {
				t.Fatalf("job %v pools %v: Matcher %q, MatchPool %q", job, pools, got, want)
			}
			f.Apply(events.Event{ID: fmt.Sprint(i), Data: &events.JobQueued{JobRef: events.JobRef{JobID: i, Labels: job}}})
			if got := m.MatchJob(f.Jobs[i]); got != want {
				t.Fatalf("folded job %v pools %v: MatchJob %q, MatchPool %q", job, pools, got, want)
			}
		}
	})
}
