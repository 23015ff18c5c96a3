// Package vz is the backend for macOS hosts on Apple silicon: one guest per
// attempt, booted by Apple's Virtualization.framework (through
// github.com/Code-Hex/vz/v3).
//
// Every decision lives here, in code that builds and is tested on any OS:
// where an attempt's files go, what the inventory is, how a stop escalates,
// the physical cap. The only darwin code is vz_darwin.go, which implements
// Hypervisor (Boot, RequestStop, ForceStop, State) and the APFS clone.
//
// Layout on the host, one directory per attempt under ClonesRoot:
//
//	<clones>/<attempt>/              the attempt's clone (its name is the attempt id)
//	<clones>/<attempt>/disk.img ...  every regular file of the base image, cloned
//	                                 (APFS clonefile on darwin: copy-on-write, instant)
//	<clones>/<attempt>/machine-id    this guest's own machine identifier (written by Boot)
//	<clones>/<attempt>/shared/       shared with the guest (virtio-fs), 0700
//	<clones>/<attempt>/shared/jitconfig      the encoded JIT config, 0600
//	<clones>/<attempt>/shared/runner-started written by the guest once its runner runs
//
// The guest image's contract: at boot, read jitconfig from the shared
// directory (mounted by macOS at /Volumes/My Shared Files/berth), start
// `run.sh --jitconfig "$(cat jitconfig)"`, then create runner-started in the
// same directory. Create returns once that file exists.
package vz

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/vmagent/backend"
)

// MaxPhysicalCap is how many macOS guests Virtualization.framework runs at
// once on one host (the macOS licence allows two).
const MaxPhysicalCap = 2

// Names of the files in an attempt's directory.
const (
	MachineIDFile  = "machine-id"
	SharedDir      = "shared"
	JITConfigName  = "jitconfig"
	RunnerStarted  = "runner-started"
	tmpClonePrefix = ".tmp-"
)

// State is what the hypervisor says about an attempt's guest.
type State int

const (
	// StateAbsent: the hypervisor knows no guest for the attempt (never
	// booted here, or gone with a previous agent process).
	StateAbsent State = iota
	StateStarting
	StateRunning
	StateStopping
	// StateStopped: the guest is off; its files may be removed.
	StateStopped
	// StateError: the hypervisor reported an internal error; the guest is
	// not running but may still hold its files.
	StateError
)

func (s State) String() string {
	return [...]string{"absent", "starting", "running", "stopping", "stopped", "error"}[s]
}

// off reports whether a guest in state s no longer runs.
func (s State) off() bool { return s == StateAbsent || s == StateStopped || s == StateError }

// Guest is what Boot needs to start one attempt's VM; every path is inside
// Dir, the attempt's own directory.
type Guest struct {
	Attempt string
	// Dir is <clones>/<attempt>, holding the cloned base image files.
	Dir string
	// MachineIDFile is this guest's machine identifier; Boot creates it with
	// a fresh identifier when it does not exist, so two clones of one base
	// image never share one.
	MachineIDFile string
	// SharedDir is shared with the guest read-write (virtio-fs).
	SharedDir string
}

// Hypervisor is the part that touches Virtualization.framework. Every call
// must return when ctx ends (the backend also stops waiting for it then, so
// a call that wedges costs a goroutine, never a loop).
type Hypervisor interface {
	// Boot configures and starts the guest; it returns once the guest
	// runs, or with the reason it could not.
	Boot(ctx context.Context, g Guest) error
	// RequestStop asks the guest OS to shut down; it returns once the
	// request is delivered, not when the guest is off.
	RequestStop(ctx context.Context, attempt string) error
	// ForceStop turns the guest off at once, like pulling its plug.
	ForceStop(ctx context.Context, attempt string) error
	// State reports the guest's state; StateAbsent when there is none.
	State(ctx context.Context, attempt string) (State, error)
}

// ErrAbandoned is wrapped by Stop when neither a graceful nor a forced stop
// ended the guest within their bounds: the guest still counts against the
// physical cap, and its files are kept until a later Stop sees it off.
var ErrAbandoned = errors.New("vz: guest did not stop")

// ErrAtCapacity is wrapped by Create when the host already runs (or cannot
// prove it stopped) PhysicalCap guests.
var ErrAtCapacity = errors.New("vz: physical cap reached")

// errOverran means a hypervisor call did not return within its bound.
var errOverran = errors.New("did not return in time")

// Config configures the backend. Durations are upper bounds; zero means the
// default given.
type Config struct {
	// BaseImage is a directory holding the base guest's files (disk.img,
	// aux.img, hardware-model, ...); each regular file is cloned per attempt.
	BaseImage string
	// ClonesRoot holds one directory per attempt; it must be on the same
	// APFS volume as BaseImage for clones to be copy-on-write.
	ClonesRoot string
	// PhysicalCap is how many guests may exist at once, 1..MaxPhysicalCap
	// (0: MaxPhysicalCap).
	PhysicalCap int
	// RunnerTimeout bounds the wait for runner-started after boot (0: 5m).
	RunnerTimeout time.Duration
	// StopGrace bounds the graceful phase of Stop: the request and the wait
	// for the guest to power off (0: 30s). It never takes more than half of
	// what is left of Stop's ctx, so that a forced stop always has time.
	StopGrace time.Duration
	// ForceTimeout bounds the forced phase of Stop (0: 15s).
	ForceTimeout time.Duration
	// Poll is how often states and runner-started are checked (0: 250ms).
	Poll time.Duration
	// Clone makes dst a clone of the regular file src (0: the platform's:
	// APFS clonefile on darwin, a plain copy elsewhere).
	Clone func(src, dst string) error
}

// Backend implements backend.Backend over a Hypervisor.
type Backend struct {
	cfg Config
	hv  Hypervisor

	mu sync.Mutex
	// live holds the attempts whose guest was booted (or whose boot was
	// tried) and not yet seen off: they count against the physical cap.
	live map[string]bool
}

// platformClone is set by vz_darwin.go to APFS clonefile.
var platformClone func(src, dst string) error

// platformHypervisor is set by vz_darwin.go; nil where vz cannot run.
var platformHypervisor func(cpus uint, memoryBytes uint64) (Hypervisor, error)

// NewPlatformHypervisor returns the Virtualization.framework hypervisor
// giving each guest cpus CPUs and memoryBytes of memory, or an error on a
// platform without it (anything but darwin/arm64 built with cgo).
func NewPlatformHypervisor(cpus uint, memoryBytes uint64) (Hypervisor, error) {
	if platformHypervisor == nil {
		return nil, errors.New("the vz backend runs only on macOS on Apple silicon, in a berth built with CGO_ENABLED=1 on darwin/arm64: use the exec or ec2 backend here")
	}
	return platformHypervisor(cpus, memoryBytes)
}

// New checks cfg, fills its defaults and returns the backend.
func New(cfg Config, hv Hypervisor) (*Backend, error) {
	if cfg.BaseImage == "" || cfg.ClonesRoot == "" {
		return nil, errors.New("vz backend: base_image and clones_root are required (a directory with the base guest's files, and one for the per-attempt clones on the same APFS volume)")
	}
	if cfg.PhysicalCap == 0 {
		cfg.PhysicalCap = MaxPhysicalCap
	}
	if cfg.PhysicalCap < 1 || cfg.PhysicalCap > MaxPhysicalCap {
		return nil, fmt.Errorf("vz backend: physical cap %d: use 1 or 2 (Virtualization.framework runs at most %d macOS guests per host)", cfg.PhysicalCap, MaxPhysicalCap)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.RunnerTimeout, 5*time.Minute)
	def(&cfg.StopGrace, 30*time.Second)
	def(&cfg.ForceTimeout, 15*time.Second)
	def(&cfg.Poll, 250*time.Millisecond)
	if cfg.Clone == nil {
		cfg.Clone = platformClone
	}
	if cfg.Clone == nil {
		cfg.Clone = copyFile
	}
	return &Backend{cfg: cfg, hv: hv, live: map[string]bool{}}, nil
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "vz" }

// PhysicalCap is how many guests this host runs at most.
func (b *Backend) PhysicalCap() int { return b.cfg.PhysicalCap }

// CanAssign implements backend.Backend: the guest reads its JIT config from
// the shared folder at boot, so vz hosts keep no warm VMs yet.
func (b *Backend) CanAssign() bool { return false }

// Assign implements backend.Backend: see CanAssign.
func (b *Backend) Assign(context.Context, backend.VM) error { return backend.ErrNoAssign }

// Live returns the attempts counted against the physical cap, sorted.
func (b *Backend) Live() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]string, 0, len(b.live))
	for a := range b.live {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}

// AttemptDir is <clones>/<attempt>, or an error when attempt is not an
// attempt id (so no path outside the clones root is ever touched).
func (b *Backend) AttemptDir(attempt string) (string, error) {
	if !events.IsAttemptID(attempt) {
		return "", fmt.Errorf("vz backend: %q is not an attempt id (berth-<job>-<n>)", attempt)
	}
	return filepath.Join(b.cfg.ClonesRoot, attempt), nil
}

// GuestFor is the Guest of attempt: its directory and files.
func (b *Backend) GuestFor(attempt string) (Guest, error) {
	dir, err := b.AttemptDir(attempt)
	if err != nil {
		return Guest{}, err
	}
	return Guest{Attempt: attempt, Dir: dir, MachineIDFile: filepath.Join(dir, MachineIDFile), SharedDir: filepath.Join(dir, SharedDir)}, nil
}

// ParseInventory turns the names in the clones root into attempt ids:
// directories named by an attempt id; anything else (files, clones still
// being made, other tools' directories) is not ours and is ignored.
func ParseInventory(entries []os.DirEntry) []string {
	var ids []string
	for _, e := range entries {
		if e.IsDir() && events.IsAttemptID(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	sort.Strings(ids)
	return ids
}

// List implements backend.Backend: the attempt-named clones under the
// clones root (a missing root is an empty inventory; an unreadable one is an
// error, never an empty answer).
func (b *Backend) List(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(b.cfg.ClonesRoot)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("vz backend: read clones root: %w", err)
	}
	return ParseInventory(entries), nil
}

// Create implements backend.Backend: clone the base image into the
// attempt's directory, give it its own machine identifier and shared
// directory with the JIT config, boot it, and wait (at most RunnerTimeout,
// and never past ctx) for its runner to start. A failed Create leaves what it
// made for Stop to remove; the guest counts against the cap from its boot
// until a Stop sees it off.
func (b *Backend) Create(ctx context.Context, vm backend.VM) error {
	g, err := b.GuestFor(vm.Attempt)
	if err != nil {
		return err
	}
	if err := b.reserve(ctx, vm.Attempt); err != nil {
		return err
	}
	if err := b.prepare(g, vm.JITConfigFile); err != nil {
		return fmt.Errorf("vz backend: prepare %s: %w", vm.Attempt, err)
	}
	if err := call(ctx, 0, func(ctx context.Context) error { return b.hv.Boot(ctx, g) }); err != nil {
		return fmt.Errorf("vz backend: boot %s: %w", vm.Attempt, err)
	}
	return b.waitRunner(ctx, g)
}

// reserve counts attempt against the physical cap, or says why it cannot.
// A guest the hypervisor already reports off is dropped from the count
// first. A retried Create of a live attempt keeps its one place.
func (b *Backend) reserve(ctx context.Context, attempt string) error {
	for _, a := range b.Live() {
		if a == attempt {
			continue
		}
		var st State
		err := call(ctx, b.cfg.Poll*4, func(ctx context.Context) (err error) { st, err = b.hv.State(ctx, a); return err })
		if err == nil && st.off() {
			b.forget(a)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.live[attempt] && len(b.live) >= b.cfg.PhysicalCap {
		live := make([]string, 0, len(b.live))
		for a := range b.live {
			live = append(live, a)
		}
		sort.Strings(live)
		return fmt.Errorf("%w: %d guests not known to be off (%s); %s must wait for one to stop", ErrAtCapacity, len(live), strings.Join(live, ", "), attempt)
	}
	b.live[attempt] = true
	return nil
}

func (b *Backend) forget(attempt string) {
	b.mu.Lock()
	delete(b.live, attempt)
	b.mu.Unlock()
}

// prepare makes the attempt's directory anew: the base image's regular
// files cloned into a temporary sibling, the shared directory with the JIT
// config, then one rename, so the inventory never sees half a clone. An
// earlier directory of the same attempt (a retried create) is replaced: it
// is this attempt's own, and a fresh clone boots from a clean disk.
func (b *Backend) prepare(g Guest, jitFile string) error {
	if err := os.MkdirAll(b.cfg.ClonesRoot, 0o700); err != nil {
		return err
	}
	tmp := filepath.Join(b.cfg.ClonesRoot, tmpClonePrefix+g.Attempt)
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	entries, err := os.ReadDir(b.cfg.BaseImage)
	if err != nil {
		return fmt.Errorf("read base image: %w (vz.base_image must be a directory with the base guest's files)", err)
	}
	n := 0
	for _, e := range entries {
		if !e.Type().IsRegular() || e.Name() == MachineIDFile || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if err := b.cfg.Clone(filepath.Join(b.cfg.BaseImage, e.Name()), filepath.Join(tmp, e.Name())); err != nil {
			return fmt.Errorf("clone %s: %w", e.Name(), err)
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("base image %s holds no files to clone", b.cfg.BaseImage)
	}
	shared := filepath.Join(tmp, SharedDir)
	if err := os.Mkdir(shared, 0o700); err != nil {
		return err
	}
	jit, err := os.ReadFile(jitFile)
	if err != nil {
		return fmt.Errorf("read JIT config: %w", err)
	}
	if err := os.WriteFile(filepath.Join(shared, JITConfigName), jit, 0o600); err != nil {
		return err
	}
	if err := os.RemoveAll(g.Dir); err != nil {
		return err
	}
	if err := os.Rename(tmp, g.Dir); err != nil {
		return err
	}
	ok = true
	return nil
}

// waitRunner polls for runner-started until RunnerTimeout or ctx ends; a
// guest that the hypervisor reports off fails at once.
func (b *Backend) waitRunner(ctx context.Context, g Guest) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.RunnerTimeout)
	defer cancel()
	marker := filepath.Join(g.SharedDir, RunnerStarted)
	tick := time.NewTicker(b.cfg.Poll)
	defer tick.Stop()
	for {
		if _, err := os.Stat(marker); err == nil {
			return nil
		}
		var st State
		err := call(ctx, b.cfg.Poll*4, func(ctx context.Context) (err error) { st, err = b.hv.State(ctx, g.Attempt); return err })
		if err == nil && st.off() {
			return fmt.Errorf("vz backend: %s: the guest is %s before its runner started (see the image's runner launch)", g.Attempt, st)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("vz backend: %s: runner not started within %s (the guest writes %s once run.sh runs): %w",
				g.Attempt, b.cfg.RunnerTimeout, marker, ctx.Err())
		case <-tick.C:
		}
	}
}

// Stop implements backend.Backend: ask the guest to shut down and wait for
// it (StopGrace, at most half of what ctx leaves); if it is still on, force
// it off and wait (ForceTimeout, within ctx); once it is off, remove its
// directory. If neither phase ends the guest, Stop returns ErrAbandoned and
// keeps the directory: the guest still counts against the cap until a later
// Stop sees it off. A guest the hypervisor does not know is stopped.
func (b *Backend) Stop(ctx context.Context, vm backend.VM) error {
	g, err := b.GuestFor(vm.Attempt)
	if err != nil {
		return err
	}
	if !b.off(ctx, g.Attempt, time.Now().Add(b.cfg.Poll*4)) {
		if err := b.escalate(ctx, g.Attempt); err != nil {
			return err
		}
	}
	b.forget(g.Attempt)
	if err := os.RemoveAll(g.Dir); err != nil {
		return fmt.Errorf("vz backend: %s is off but its clone stays: %w", g.Attempt, err)
	}
	os.RemoveAll(filepath.Join(b.cfg.ClonesRoot, tmpClonePrefix+g.Attempt))
	return nil
}

// escalate runs the graceful then the forced phase; nil once the guest is
// seen off.
func (b *Backend) escalate(ctx context.Context, attempt string) error {
	graceful := b.cfg.StopGrace
	if dl, ok := ctx.Deadline(); ok {
		graceful = min(graceful, time.Until(dl)/2)
	}
	gracefulEnd := time.Now().Add(graceful)
	reqErr := call(ctx, graceful, func(ctx context.Context) error { return b.hv.RequestStop(ctx, attempt) })
	if reqErr == nil && b.off(ctx, attempt, gracefulEnd) {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %s: graceful stop (%v) then no time left for a forced one: %w", ErrAbandoned, attempt, why(reqErr), ctx.Err())
	}
	forceEnd := time.Now().Add(b.cfg.ForceTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(forceEnd) {
		forceEnd = dl
	}
	forceErr := call(ctx, time.Until(forceEnd), func(ctx context.Context) error { return b.hv.ForceStop(ctx, attempt) })
	if b.off(ctx, attempt, forceEnd) {
		return nil
	}
	return fmt.Errorf("%w: %s: graceful stop: %v; forced stop: %v; it still counts against the physical cap until a later stop sees it off",
		ErrAbandoned, attempt, why(reqErr), why(forceErr))
}

func why(err error) string {
	if err == nil {
		return "the guest stayed on"
	}
	return err.Error()
}

// off polls the guest's state until it is off (true) or until, or ctx
// ends (false). A State call that fails or wedges is not a "yes".
func (b *Backend) off(ctx context.Context, attempt string, until time.Time) bool {
	for {
		left := time.Until(until)
		var st State
		err := call(ctx, max(min(left, b.cfg.Poll*4), time.Millisecond), func(ctx context.Context) (err error) {
			st, err = b.hv.State(ctx, attempt)
			return err
		})
		if err == nil && st.off() {
			return true
		}
		if time.Until(until) <= 0 {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(min(b.cfg.Poll, max(time.Until(until), 0))):
		}
	}
}

// call runs f with a context that ends after bound (0: ctx's own end) and
// returns its error, or errOverran (wrapping ctx's error when ctx ended)
// once the bound passes even if f has not returned: a wedged hypervisor
// call costs a goroutine until it does return, never the caller's time.
func call(ctx context.Context, bound time.Duration, f func(context.Context) error) error {
	if bound > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, bound)
		defer cancel()
	}
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", errOverran, ctx.Err())
	}
}

// copyFile is the clone where APFS clonefile is not available: a plain
// copy, mode 0600.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
