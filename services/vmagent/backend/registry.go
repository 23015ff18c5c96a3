package backend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sort"
	"sync"
	"time"

	"github.com/berth-ci/berth/events"
)

// Steps are the deadlines every backend's steps run under (law 3). Each
// backend's settings embed them inline, so an agent's section reads
// `backend: {exec: {create_timeout: 5m, ...}}` whatever the kind, and the
// agent takes them from here rather than from a backend-specific field.
type Steps struct {
	// CreateTimeout bounds Create (and Assign, the rest of a warm create).
	CreateTimeout time.Duration `yaml:"create_timeout"`
	// StopTimeout bounds one Stop; an overrun is abandoned and retried.
	StopTimeout time.Duration `yaml:"stop_timeout"`
	// RetryBase is the first wait before a failed or overrun stop is tried
	// again; it doubles up to 5 min. 0 means the agent's 5 s.
	RetryBase time.Duration `yaml:"retry_base"`
}

// DefaultSteps are the deadlines of a kind that names none of its own.
var DefaultSteps = Steps{CreateTimeout: 5 * time.Minute, StopTimeout: 2 * time.Minute}

// StepDeadlines makes Steps (and every settings type embedding it) answer
// Settings.StepDeadlines.
func (s *Steps) StepDeadlines() *Steps { return s }

// Defaults lets Steps alone be a section (a backend with nothing else to
// set, or one plugged in by a test); embedding types define their own.
func (s *Steps) Defaults(Host) {}

// Validate checks the deadlines alone (see Defaults).
func (s *Steps) Validate(at string, _ Host, bad Report) { s.Check(at, bad) }

// Default fills each unset deadline from def.
func (s *Steps) Default(def Steps) {
	for _, p := range []struct{ v, d *time.Duration }{{&s.CreateTimeout, &def.CreateTimeout},
		{&s.StopTimeout, &def.StopTimeout}, {&s.RetryBase, &def.RetryBase}} {
		if *p.v == 0 {
			*p.v = *p.d
		}
	}
}

// Check reports deadlines that could never be met; at names the section.
func (s Steps) Check(at string, bad Report) {
	if s.CreateTimeout <= 0 || s.StopTimeout <= 0 || s.RetryBase < 0 {
		bad("%s: create_timeout and stop_timeout must be positive, retry_base not negative", at)
	}
}

// Report collects one configuration problem; the message starts with the
// dotted key it is about, so the config loader can point at its line.
type Report func(format string, args ...any)

// Host is what a backend may know of the agent it serves.
type Host struct {
	// Name is the agent's host name (agents[].host).
	Name string
	// DataDir is the config's data_dir; the agent's own files live under
	// DataDir/agents/Name.
	DataDir string
	// PhysicalCap is the agent's physical_cap (after its default).
	PhysicalCap int
	// Shapes are the machine shapes of the pools the agent advertises,
	// by advertised pool (nil for a pool that declares none): a backend's
	// Validate checks it can build each (vz: an image it lists).
	Shapes map[string]*events.Shape
	// Logger is the agent's logger (nil in config checks).
	Logger *slog.Logger
}

// Settings is one backend's section of an agent's config, a pointer to a
// struct that the config package decodes strictly by its yaml tags.
type Settings interface {
	// StepDeadlines returns the section's common deadlines (embed Steps).
	StepDeadlines() *Steps
	// Defaults fills unset fields for host h.
	Defaults(h Host)
	// Validate reports every problem of the section; at names it, e.g.
	// agents[0].backend.exec.
	Validate(at string, h Host, bad Report)
}

// Kind is one registered backend.
type Kind struct {
	// Name is the key of its section under backend:, e.g. "exec".
	Name string
	// NewSettings returns an empty section to decode into.
	NewSettings func() Settings
	// Steps are the kind's default deadlines (zero: DefaultSteps).
	Steps Steps
	// New builds the backend from a defaulted, validated section; nil
	// where the backend cannot run (vz off macOS), see Needs.
	New func(ctx context.Context, s Settings, h Host) (Backend, error)
	// Needs says what platform New needs, for the error when it is nil.
	Needs string
}

// ErrUnavailable is returned by Build for a kind registered without a
// constructor on this platform.
var ErrUnavailable = errors.New("backend not available on this platform")

var (
	mu    sync.RWMutex
	kinds = map[string]Kind{}
)

// Register adds a kind; each backend package calls it from an init func.
// Registering one name twice is a programming error and panics.
func Register(k Kind) {
	mu.Lock()
	defer mu.Unlock()
	if k.Name == "" || k.NewSettings == nil {
		panic("backend.Register: a kind needs a name and NewSettings")
	}
	if _, dup := kinds[k.Name]; dup {
		panic("backend.Register: kind " + k.Name + " registered twice")
	}
	if k.Steps == (Steps{}) {
		k.Steps = DefaultSteps
	}
	kinds[k.Name] = k
}

// Lookup returns the kind registered under name.
func Lookup(name string) (Kind, bool) {
	mu.RLock()
	defer mu.RUnlock()
	k, ok := kinds[name]
	return k, ok
}

// Kinds lists the registered names, sorted.
func Kinds() []string {
	mu.RLock()
	defer mu.RUnlock()
	out := make([]string, 0, len(kinds))
	for n := range kinds {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Build constructs the backend of kind name from its section.
func Build(ctx context.Context, name string, s Settings, h Host) (Backend, error) {
	k, ok := Lookup(name)
	if !ok {
		return nil, fmt.Errorf("backend %q: not a registered kind (known: %v)", name, Kinds())
	}
	if k.New == nil {
		return nil, fmt.Errorf("backend %s needs %s; this berth runs on %s/%s: use another backend here: %w",
			name, k.Needs, runtime.GOOS, runtime.GOARCH, ErrUnavailable)
	}
	return k.New(ctx, s, h)
}
