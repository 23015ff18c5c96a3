// Package vz is the backend for macOS hosts on Apple silicon: one guest per
// attempt, booted by Apple's Virtualization.framework (through
// github.com/Code-Hex/vz/v3).
//
// Every decision lives here, in code that builds and is tested on any OS:
// where an attempt's files go, what the inventory is, how a stop escalates,
// the physical cap. The only darwin code is vz_darwin.go, which implements
// Hypervisor on Virtualization.framework, and the APFS clone.
//
// Each guest runs in a helper process of its own (helpers.go: `berth
// vz-guest`, holding one VM, spoken to over its stdin and stdout in framed
// JSON, proto.go), never in the agent: a stop that wedges is escalated to
// SIGKILL of that helper, which ends the guest and gives its place under
// the physical cap back (Virtualization.framework ends a process's VMs with
// the process).
//
// Layout on the host, one directory per attempt under ClonesRoot:
//
//	<clones>/<attempt>/              the attempt's clone (its name is the attempt id)
//	<clones>/<attempt>/disk.img ...  every regular file of the base image, cloned
//	                                 (APFS clonefile on darwin: copy-on-write, instant)
//	<clones>/<attempt>/machine-id    this guest's own machine identifier (written by Boot)
//	<clones>/<attempt>/shared/       shared with the guest (virtio-fs), 0700
//	<clones>/<attempt>/shared/jitconfig      the encoded JIT config, 0600
//	<clones>/<attempt>/shared/guest-ready    written by the guest's daemon once it waits for a JIT config
//	<clones>/<attempt>/shared/runner-started written by the guest once its runner runs
//	<clones>/<attempt>/shared/runner-exited  written by the guest when its runner ends (its exit status)
//	<clones>/<attempt>/shared/runner.log     the runner's output, written by the guest (RunnerOutput)
//
// The guest image's contract (deploy/guest: a launchd daemon and its
// script): at boot, write guest-ready, wait for jitconfig in the shared
// directory (mounted by macOS at /Volumes/My Shared Files/berth), start
// `run.sh --jitconfig "$(cat jitconfig)"`, create runner-started, and write
// the runner's exit status to runner-exited when it ends. A cold Create
// puts jitconfig there before boot and returns once runner-started exists; a
// warm Create boots without it and returns at guest-ready, and Assign later
// puts jitconfig on the share (the daemon picks it up).
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
	"github.com/berth-ci/berth/services/clock"
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
	GuestReady     = "guest-ready"
	RunnerStarted  = "runner-started"
	RunnerExited   = "runner-exited"
	tmpClonePrefix = ".tmp-"
)

// Files of a macOS guest bundle (a base image; cloned per attempt).
const (
	diskImageName     = "disk.img"
	auxStorageName    = "aux.img"
	hardwareModelName = "hardware-model"
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
	// CPUs and MemoryBytes are the guest's machine (Machine, from its
	// attempt's shape); 0 in a Guest made by GuestFor alone.
	CPUs        uint   `json:"cpus,omitempty"`
	MemoryBytes uint64 `json:"memory_bytes,omitempty"`
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
	// DetachNetwork disconnects the guest's network devices; Stop calls it
	// before asking the guest to stop (a guest stopped with its network
	// attached is what wedges the framework's stop most often).
	DetachNetwork(ctx context.Context, attempt string) error
	// Drop frees every object held for the guest (its VM object, its disk
	// attachment; with helpers, the helper process). Stop calls it once the
	// guest is off; a guest the hypervisor does not know is dropped.
	Drop(ctx context.Context, attempt string) error
}

// Killer is a Hypervisor that can end a guest no stop ends: by killing the
// process that holds it. Kill returns once that process is gone (the guest
// with it), or with why not.
type Killer interface {
	Kill(ctx context.Context, attempt string) error
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
	// Images are more base images by name, chosen by a machine shape's
	// image (MachineFor); a shape naming none boots BaseImage.
	Images map[string]string
	// CPUs and Memory (bytes) are a guest's when its shape sets none (0:
	// 4 CPUs, 8 GiB).
	CPUs   uint
	Memory uint64
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
	// KillTimeout is kept back from Stop's ctx for the last phase when the
	// hypervisor is a Killer: the helper's SIGKILL and the wait for it to
	// exit (0: 10s).
	KillTimeout time.Duration
	// Clock times every phase and poll (nil: the wall clock).
	Clock clock.Clock
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
	clk clock.Clock

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
	def(&cfg.KillTimeout, 10*time.Second)
	if cfg.CPUs == 0 {
		cfg.CPUs = 4
	}
	if cfg.Memory == 0 {
		cfg.Memory = 8 << 30
	}
	if cfg.Clone == nil {
		cfg.Clone = platformClone
	}
	if cfg.Clone == nil {
		cfg.Clone = copyFile
	}
	return &Backend{cfg: cfg, hv: hv, clk: clock.Or(cfg.Clock), live: map[string]bool{}}, nil
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "vz" }

// PhysicalCap is how many guests this host runs at most.
func (b *Backend) PhysicalCap() int { return b.cfg.PhysicalCap }

// CanAssign implements backend.Backend: a warm guest's daemon waits for
// its JIT config on the share, so vz hosts keep warm VMs.
func (b *Backend) CanAssign() bool { return true }

// Assign implements backend.Backend: put the JIT config on the warm guest's
// share (written aside, then renamed, so the daemon never reads half of
// it) and wait, at most RunnerTimeout and never past ctx, for the runner to
// start.
func (b *Backend) Assign(ctx context.Context, vm backend.VM) error {
	g, err := b.GuestFor(vm.Attempt)
	if err != nil {
		return err
	}
	if !b.isLive(vm.Attempt) {
		return fmt.Errorf("vz backend: assign %s: no guest of it runs on this host (was it created warm here?)", vm.Attempt)
	}
	jit, err := os.ReadFile(vm.JITConfigFile)
	if err != nil {
		return fmt.Errorf("vz backend: assign %s: read JIT config: %w", vm.Attempt, err)
	}
	tmp := filepath.Join(g.SharedDir, tmpClonePrefix+JITConfigName)
	if err := os.WriteFile(tmp, jit, 0o600); err != nil {
		return fmt.Errorf("vz backend: assign %s: %w", vm.Attempt, err)
	}
	if err := os.Rename(tmp, filepath.Join(g.SharedDir, JITConfigName)); err != nil {
		return fmt.Errorf("vz backend: assign %s: %w", vm.Attempt, err)
	}
	return b.waitFor(ctx, g, RunnerStarted)
}

func (b *Backend) isLive(attempt string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.live[attempt]
}

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

// Create implements backend.Backend: resolve the attempt's machine from its
// shape (MachineFor: CPUs, memory, disk, image), clone its image into the
// attempt's directory (the disk grown to the shape's), give it its own machine identifier and shared
// directory with the JIT config, boot it, and wait (at most RunnerTimeout,
// and never past ctx) for its runner to start. A warm Create (vm.Warm, no
// JIT config yet) waits for the guest's daemon to be ready instead; Assign
// hands it the config. A failed Create leaves what it made for Stop to
// remove; the guest counts against the cap from its boot until a Stop sees
// it off.
func (b *Backend) Create(ctx context.Context, vm backend.VM) error {
	g, err := b.GuestFor(vm.Attempt)
	if err != nil {
		return err
	}
	m, err := b.cfg.MachineFor(vm.Shape)
	if err != nil {
		return fmt.Errorf("%s: %w", vm.Attempt, err)
	}
	g.CPUs, g.MemoryBytes = m.CPUs, m.MemoryBytes
	if err := b.reserve(ctx, vm.Attempt); err != nil {
		return err
	}
	if err := b.prepare(g, m, vm.JITConfigFile); err != nil {
		return fmt.Errorf("vz backend: prepare %s: %w", vm.Attempt, err)
	}
	if err := b.call(ctx, 0, func(ctx context.Context) error { return b.hv.Boot(ctx, g) }); err != nil {
		return fmt.Errorf("vz backend: boot %s: %w", vm.Attempt, err)
	}
	if vm.JITConfigFile == "" {
		return b.waitFor(ctx, g, GuestReady)
	}
	return b.waitFor(ctx, g, RunnerStarted)
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
		err := b.call(ctx, b.cfg.Poll*4, func(ctx context.Context) (err error) { st, err = b.hv.State(ctx, a); return err })
		if err == nil && st.off() {
			_ = b.call(ctx, 0, func(ctx context.Context) error { return b.hv.Drop(ctx, a) })
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

// prepare makes the attempt's directory anew: the regular files of m's
// image cloned into a temporary sibling (disk.img grown to m's disk), the shared directory with the JIT
// config, then one rename, so the inventory never sees half a clone. An
// earlier directory of the same attempt (a retried create) is replaced: it
// is this attempt's own, and a fresh clone boots from a clean disk.
func (b *Backend) prepare(g Guest, m Machine, jitFile string) error {
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
	entries, err := os.ReadDir(m.BaseImage)
	if err != nil {
		return fmt.Errorf("read image %s: %w (vz.base_image and each of vz.images must be a directory with a base guest's files)", m.BaseImage, err)
	}
	n := 0
	for _, e := range entries {
		if !e.Type().IsRegular() || e.Name() == MachineIDFile || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if err := b.cfg.Clone(filepath.Join(m.BaseImage, e.Name()), filepath.Join(tmp, e.Name())); err != nil {
			return fmt.Errorf("clone %s: %w", e.Name(), err)
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("image %s holds no files to clone", m.BaseImage)
	}
	if err := growDisk(tmp, m.DiskBytes); err != nil {
		return err
	}
	shared := filepath.Join(tmp, SharedDir)
	if err := os.Mkdir(shared, 0o700); err != nil {
		return err
	}
	if jitFile != "" { // a warm guest gets it on Assign
		jit, err := os.ReadFile(jitFile)
		if err != nil {
			return fmt.Errorf("read JIT config: %w", err)
		}
		if err := os.WriteFile(filepath.Join(shared, JITConfigName), jit, 0o600); err != nil {
			return err
		}
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

// waitFor polls the guest's share for the status file name (GuestReady
// or RunnerStarted) until RunnerTimeout or ctx ends. A guest the hypervisor
// reports off fails at once, and so does a guest whose daemon wrote
// runner-exited first (no runner in the image, or one that could not
// start): the image's fault.
func (b *Backend) waitFor(ctx context.Context, g Guest, name string) error {
	limit := b.clk.NewTimer(b.cfg.RunnerTimeout)
	defer limit.Stop()
	marker := filepath.Join(g.SharedDir, name)
	tick := b.clk.NewTicker(b.cfg.Poll)
	defer tick.Stop()
	for {
		if _, err := os.Stat(marker); err == nil {
			return nil
		}
		if status, err := os.ReadFile(filepath.Join(g.SharedDir, RunnerExited)); err == nil {
			return fmt.Errorf("vz backend: %s: the guest's runner ended before %s (%s): see /tmp/berth-guest.log in the guest: %w",
				g.Attempt, name, strings.TrimSpace(string(status)), backend.ErrImage)
		}
		var st State
		err := b.call(ctx, b.cfg.Poll*4, func(ctx context.Context) (err error) { st, err = b.hv.State(ctx, g.Attempt); return err })
		if err == nil && st.off() {
			return fmt.Errorf("vz backend: %s: the guest is %s before it wrote %s (see the image's berth daemon, docs/macos.md)", g.Attempt, st, name)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("vz backend: %s: no %s within the create deadline (the guest's berth daemon writes it, docs/macos.md): %w",
				g.Attempt, marker, ctx.Err())
		case <-limit.C():
			return fmt.Errorf("vz backend: %s: no %s within %s (the guest's berth daemon writes it, docs/macos.md): %w",
				g.Attempt, marker, b.cfg.RunnerTimeout, context.DeadlineExceeded)
		case <-tick.C():
		}
	}
}

// RunnerOutput implements backend.RunnerOutput: the runner's output the
// guest's daemon writes to the share.
func (b *Backend) RunnerOutput(ctx context.Context, vm backend.VM) ([]byte, error) {
	g, err := b.GuestFor(vm.Attempt)
	if err != nil {
		return nil, err
	}
	return backend.ReadTail(filepath.Join(g.SharedDir, backend.RunnerLogName))
}

// Stop implements backend.Backend: StopReport without the ending.
func (b *Backend) Stop(ctx context.Context, vm backend.VM) error {
	_, err := b.StopReport(ctx, vm)
	return err
}

// StopReport implements backend.StopReporter. It detaches the guest's
// network and asks it to shut down, and waits (StopGrace, at most half of
// what ctx leaves after the kill's share): events.StopClean; if it is still
// on, forces it off and waits (ForceTimeout, within what ctx leaves after
// the kill's share): events.StopForced; if it is still on and the
// hypervisor is a Killer, kills the process holding it: events.StopKilled.
// Once the guest is off it drops every object held for it, frees its place
// under the cap and removes its directory. If no phase ends the guest, it
// returns ErrAbandoned and keeps the directory: the guest still counts
// against the cap until a later Stop sees it off. A guest the hypervisor
// does not know is stopped (ended "").
func (b *Backend) StopReport(ctx context.Context, vm backend.VM) (string, error) {
	g, err := b.GuestFor(vm.Attempt)
	if err != nil {
		return "", err
	}
	ended := ""
	var st State
	err = b.call(ctx, b.cfg.Poll*4, func(ctx context.Context) (err error) { st, err = b.hv.State(ctx, g.Attempt); return err })
	if err != nil || !st.off() {
		if ended, err = b.escalate(ctx, g.Attempt); err != nil {
			return "", err
		}
	}
	// Dropping is the OS's time too (a helper's exit): bounded by ctx.
	if err := b.call(ctx, 0, func(ctx context.Context) error { return b.hv.Drop(ctx, g.Attempt) }); err != nil {
		// The guest is off: what stays is memory, not a place under the cap.
		err = fmt.Errorf("vz backend: %s is off but its objects were not dropped: %w", g.Attempt, err)
		b.forget(g.Attempt)
		return ended, err
	}
	b.forget(g.Attempt)
	if err := os.RemoveAll(g.Dir); err != nil {
		return ended, fmt.Errorf("vz backend: %s is off but its clone stays: %w", g.Attempt, err)
	}
	os.RemoveAll(filepath.Join(b.cfg.ClonesRoot, tmpClonePrefix+g.Attempt))
	return ended, nil
}

// escalate runs the graceful, the forced and (with a Killer) the kill
// phase; it returns how the guest ended once it is seen off.
func (b *Backend) escalate(ctx context.Context, attempt string) (string, error) {
	killer, canKill := b.hv.(Killer)
	reserve := time.Duration(0)
	if canKill {
		reserve = b.cfg.KillTimeout
	}
	left := func() time.Duration { // what ctx leaves for the graceful and forced phases
		if dl, ok := ctx.Deadline(); ok {
			return dl.Sub(b.clk.Now()) - reserve
		}
		return time.Duration(1<<63 - 1)
	}
	graceful := max(min(b.cfg.StopGrace, left()/2), 0)
	gracefulEnd := b.clk.Now().Add(graceful)
	// Detaching is quick when the framework answers; a quarter of the
	// grace at most, so a wedged detach still leaves the request its time.
	detachErr := b.call(ctx, max(graceful/4, time.Millisecond), func(ctx context.Context) error { return b.hv.DetachNetwork(ctx, attempt) })
	reqErr := b.call(ctx, max(gracefulEnd.Sub(b.clk.Now()), time.Millisecond), func(ctx context.Context) error { return b.hv.RequestStop(ctx, attempt) })
	if reqErr == nil && b.off(ctx, attempt, gracefulEnd) {
		return events.StopClean, nil
	}
	if reqErr == nil && detachErr != nil {
		reqErr = fmt.Errorf("network not detached (%v), then the guest stayed on", detachErr)
	}
	var forceErr error
	if force := min(b.cfg.ForceTimeout, left()); force > 0 && ctx.Err() == nil {
		forceEnd := b.clk.Now().Add(force)
		forceErr = b.call(ctx, force, func(ctx context.Context) error { return b.hv.ForceStop(ctx, attempt) })
		if b.off(ctx, attempt, forceEnd) {
			return events.StopForced, nil
		}
	} else {
		forceErr = errors.New("no time left for it")
	}
	if canKill && ctx.Err() == nil {
		// The kill has what is left of ctx (its reserve at least): a
		// signal and the wait for the process to be reaped, the OS's time.
		killErr := b.call(ctx, 0, func(ctx context.Context) error { return killer.Kill(ctx, attempt) })
		if killErr == nil {
			return events.StopKilled, nil
		}
		return "", fmt.Errorf("%w: %s: graceful stop: %v; forced stop: %v; kill of its helper: %v; it still counts against the physical cap until a later stop sees it off",
			ErrAbandoned, attempt, why(reqErr), why(forceErr), killErr)
	}
	return "", fmt.Errorf("%w: %s: graceful stop: %v; forced stop: %v; it still counts against the physical cap until a later stop sees it off",
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
		left := until.Sub(b.clk.Now())
		var st State
		err := b.call(ctx, max(min(left, b.cfg.Poll*4), time.Millisecond), func(ctx context.Context) (err error) {
			st, err = b.hv.State(ctx, attempt)
			return err
		})
		if err == nil && st.off() {
			return true
		}
		left = until.Sub(b.clk.Now())
		if left <= 0 {
			return false
		}
		t := b.clk.NewTimer(min(b.cfg.Poll, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C():
		}
	}
}

// call runs f and returns its error, or errOverran once bound passes on
// the backend's clock (wrapping context.DeadlineExceeded) or ctx ends
// (wrapping ctx's error), even if f has not returned: f's context ends
// then too, and a wedged hypervisor call costs a goroutine until it does
// return, never the caller's time. bound 0 is ctx's own end.
func (b *Backend) call(ctx context.Context, bound time.Duration, f func(context.Context) error) error {
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var expired <-chan time.Time
	if bound > 0 {
		t := b.clk.NewTimer(bound)
		defer t.Stop()
		expired = t.C()
	}
	done := make(chan error, 1)
	go func() { done <- f(fctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", errOverran, ctx.Err())
	case <-expired:
		return fmt.Errorf("%w: %w", errOverran, context.DeadlineExceeded)
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
