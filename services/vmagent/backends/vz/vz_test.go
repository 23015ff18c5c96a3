package vz

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/clock"
	"github.com/berth-ci/berth/services/vmagent/backend"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Re-executed as a guest's helper by a test through Helpers (on a Mac,
	// vz_darwin_test.go: the signed test binary holds a real guest).
	if os.Getenv(testHelperEnv) != "" {
		if err := Serve(context.Background(), os.Stdin, os.Stdout, NewPlatformHypervisor); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// testHelperEnv makes this test binary serve as a helper (TestMain).
const testHelperEnv = "BERTH_VZ_TEST_HELPER"

// behaviour of one fake hypervisor call.
type behaviour int

const (
	ok     behaviour = iota
	fail             // returns an error at once
	wedge            // blocks, ignoring ctx, until the test ends
	late             // blocks, ignoring ctx, for lateBy, then succeeds
	ignore           // RequestStop only: succeeds, but the guest stays on
)

const lateBy = 600 * time.Millisecond

// fakeHV is a hypervisor whose every call can wedge, fail or succeed late.
// A booted guest writes runner-started after runnerAfter (unless noRunner).
type fakeHV struct {
	t *testing.T

	mu                          sync.Mutex
	boot, request, force, state behaviour
	runnerAfter                 time.Duration
	noRunner, dieAfterBoot      bool
	states                      map[string]State
	guests                      map[string]Guest
	calls                       map[string]int
	order                       []string        // every call's name, in order
	objects                     map[string]bool // VM objects held: from Boot until Drop
	release                     chan struct{}
	background                  sync.WaitGroup
}

func newFake(t *testing.T) *fakeHV {
	f := &fakeHV{t: t, states: map[string]State{}, guests: map[string]Guest{}, calls: map[string]int{}, objects: map[string]bool{}, release: make(chan struct{})}
	t.Cleanup(func() { close(f.release); f.background.Wait() })
	return f
}

func (f *fakeHV) set(fn func(f *fakeHV)) { f.mu.Lock(); fn(f); f.mu.Unlock() }

func (f *fakeHV) count(name string) int { f.mu.Lock(); defer f.mu.Unlock(); return f.calls[name] }

func (f *fakeHV) setState(a string, s State) { f.mu.Lock(); f.states[a] = s; f.mu.Unlock() }

// enter records a call and applies its behaviour; it reports whether the
// call's effect should take place.
func (f *fakeHV) enter(name string, b behaviour) error {
	f.mu.Lock()
	f.calls[name]++
	f.order = append(f.order, name)
	f.mu.Unlock()
	switch b {
	case fail:
		return errors.New(name + ": injected failure")
	case wedge:
		<-f.release
		return errors.New(name + ": released at test end")
	case late:
		select {
		case <-time.After(lateBy):
		case <-f.release:
		}
	}
	return nil
}

func (f *fakeHV) Boot(ctx context.Context, g Guest) error {
	f.mu.Lock()
	b, after, noRunner, die := f.boot, f.runnerAfter, f.noRunner, f.dieAfterBoot
	f.guests[g.Attempt] = g
	f.objects[g.Attempt] = true
	f.mu.Unlock()
	if err := f.enter("boot", b); err != nil {
		return err
	}
	if err := os.WriteFile(g.MachineIDFile, []byte("id-"+g.Attempt), 0o600); err != nil {
		return err
	}
	f.setState(g.Attempt, StateRunning)
	if die {
		f.setState(g.Attempt, StateError)
	}
	if !noRunner && !die {
		f.background.Add(1)
		go func() {
			defer f.background.Done()
			select {
			case <-time.After(after):
				os.WriteFile(filepath.Join(g.SharedDir, RunnerStarted), nil, 0o600)
			case <-f.release:
			}
		}()
	}
	return nil
}

func (f *fakeHV) RequestStop(ctx context.Context, a string) error {
	f.mu.Lock()
	b := f.request
	f.mu.Unlock()
	if err := f.enter("request", b); err != nil {
		return err
	}
	if b != ignore {
		f.setState(a, StateStopped)
	}
	return nil
}

func (f *fakeHV) ForceStop(ctx context.Context, a string) error {
	f.mu.Lock()
	b := f.force
	f.mu.Unlock()
	if err := f.enter("force", b); err != nil {
		return err
	}
	f.setState(a, StateStopped)
	return nil
}

func (f *fakeHV) DetachNetwork(ctx context.Context, a string) error { return f.enter("detach", ok) }

// Drop forgets the guest: its VM object is gone, and so is its state.
func (f *fakeHV) Drop(ctx context.Context, a string) error {
	if err := f.enter("drop", ok); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.objects, a)
	delete(f.states, a)
	return nil
}

// callOrder is every call's name so far, in order (a copy).
func (f *fakeHV) callOrder() []string { f.mu.Lock(); defer f.mu.Unlock(); return slices.Clone(f.order) }

// held is how many VM objects the fake holds.
func (f *fakeHV) held() int { f.mu.Lock(); defer f.mu.Unlock(); return len(f.objects) }

func (f *fakeHV) State(ctx context.Context, a string) (State, error) {
	f.mu.Lock()
	b := f.state
	f.mu.Unlock()
	if err := f.enter("state", b); err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.states[a], nil
}

// fixture is a backend over a fake, with a base image of two files.
type fixture struct {
	b    *Backend
	hv   *fakeHV
	root string
	base string
	jit  string
}

func newFixture(t *testing.T, mod func(*Config)) *fixture {
	t.Helper()
	dir := t.TempDir()
	base := filepath.Join(dir, "base")
	must(t, os.MkdirAll(base, 0o755))
	must(t, os.WriteFile(filepath.Join(base, "disk.img"), []byte("disk bytes"), 0o644))
	must(t, os.WriteFile(filepath.Join(base, "aux.img"), []byte("aux bytes"), 0o644))
	must(t, os.WriteFile(filepath.Join(base, MachineIDFile), []byte("the base image's own id"), 0o644))
	jit := filepath.Join(dir, "jitconfig")
	must(t, os.WriteFile(jit, []byte("encoded-jit"), 0o600))
	cfg := Config{BaseImage: base, ClonesRoot: filepath.Join(dir, "clones"), RunnerTimeout: 2 * time.Second,
		StopGrace: 400 * time.Millisecond, ForceTimeout: 400 * time.Millisecond, Poll: 10 * time.Millisecond}
	if mod != nil {
		mod(&cfg)
	}
	hv := newFake(t)
	b, err := New(cfg, hv)
	must(t, err)
	return &fixture{b: b, hv: hv, root: cfg.ClonesRoot, base: base, jit: jit}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func (fx *fixture) vm(attempt string) backend.VM {
	return backend.VM{Attempt: attempt, Pool: "macos", Host: "mac-1", JITConfigFile: fx.jit}
}

func deadline(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestCreateClonesTheBaseImageIntoTheAttemptsOwnFiles(t *testing.T) {
	// Given a backend whose guest starts its runner shortly after boot.
	fx := newFixture(t, func(c *Config) {})
	fx.hv.set(func(f *fakeHV) { f.runnerAfter = 50 * time.Millisecond })

	// When attempt berth-42-1 is created.
	must(t, fx.b.Create(deadline(t, 5*time.Second), fx.vm("berth-42-1")))

	// Then its directory is named by the attempt and holds a clone of each
	// base file, its own shared dir with the JIT config (0600) and its own
	// machine identifier (not the base image's).
	dir := filepath.Join(fx.root, "berth-42-1")
	for name, want := range map[string]string{"disk.img": "disk bytes", "aux.img": "aux bytes", "machine-id": "id-berth-42-1",
		"shared/jitconfig": "encoded-jit", "shared/runner-started": ""} {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", name, got, err, want)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, SharedDir, JITConfigName)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("jitconfig mode: %v %v, want 0600", fi.Mode(), err)
	}
	g := fx.hv.guests["berth-42-1"]
	if g.Dir != dir || g.SharedDir != filepath.Join(dir, "shared") || g.MachineIDFile != filepath.Join(dir, "machine-id") {
		t.Errorf("Boot got %+v; want every path inside %s", g, dir)
	}
	if ids, err := fx.b.List(context.Background()); err != nil || !slices.Equal(ids, []string{"berth-42-1"}) {
		t.Errorf("List = %v, %v; want [berth-42-1] and no temporary clone", ids, err)
	}
	if !slices.Equal(fx.b.Live(), []string{"berth-42-1"}) {
		t.Errorf("Live = %v", fx.b.Live())
	}
}

func TestCreateRefusesWhatIsNotAnAttemptID(t *testing.T) {
	fx := newFixture(t, nil)
	for _, bad := range []string{"../etc", "berth-1", "", "x/berth-1-1"} {
		if err := fx.b.Create(deadline(t, time.Second), fx.vm(bad)); err == nil {
			t.Errorf("Create(%q) succeeded", bad)
		}
		if err := fx.b.Stop(deadline(t, time.Second), fx.vm(bad)); err == nil {
			t.Errorf("Stop(%q) succeeded", bad)
		}
	}
	if n := fx.hv.count("boot"); n != 0 {
		t.Errorf("boot called %d times", n)
	}
}

func TestARetriedCreateStartsFromAFreshClone(t *testing.T) {
	fx := newFixture(t, nil)
	must(t, fx.b.Create(deadline(t, 5*time.Second), fx.vm("berth-7-1")))
	stray := filepath.Join(fx.root, "berth-7-1", "written-by-the-first-boot")
	must(t, os.WriteFile(stray, nil, 0o600))
	must(t, fx.b.Create(deadline(t, 5*time.Second), fx.vm("berth-7-1")))
	if _, err := os.Stat(stray); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the retried create kept the first clone's files: %v", err)
	}
	if got := fx.b.Live(); !slices.Equal(got, []string{"berth-7-1"}) {
		t.Errorf("a retried create took a second place: Live = %v", got)
	}
}

func TestInventoryIsTheAttemptNamedClonesOnly(t *testing.T) {
	fx := newFixture(t, nil)
	// A missing root is an empty inventory.
	if ids, err := fx.b.List(context.Background()); err != nil || len(ids) != 0 {
		t.Fatalf("List of a missing root = %v, %v", ids, err)
	}
	for _, d := range []string{"berth-1-1", "berth-20-3", ".tmp-berth-4-1", "other-vm", "berth-x-1", "Berth-5-1"} {
		must(t, os.MkdirAll(filepath.Join(fx.root, d), 0o700))
	}
	must(t, os.WriteFile(filepath.Join(fx.root, "berth-3-1"), nil, 0o600)) // a file, not a clone
	ids, err := fx.b.List(context.Background())
	if err != nil || !slices.Equal(ids, []string{"berth-1-1", "berth-20-3"}) {
		t.Errorf("List = %v, %v; want [berth-1-1 berth-20-3]", ids, err)
	}
	// An unreadable root is an error, never an empty inventory.
	fx2 := newFixture(t, nil)
	must(t, os.WriteFile(fx2.root, []byte("not a directory"), 0o600))
	if ids, err := fx2.b.List(context.Background()); err == nil {
		t.Errorf("List of an unreadable root = %v, nil; want an error", ids)
	}
}

func TestCreateWaitsForTheRunnerWithADeadline(t *testing.T) {
	t.Run("runner never starts", func(t *testing.T) {
		fx := newFixture(t, func(c *Config) { c.RunnerTimeout = 300 * time.Millisecond })
		fx.hv.set(func(f *fakeHV) { f.noRunner = true })
		start := time.Now()
		err := fx.b.Create(deadline(t, 5*time.Second), fx.vm("berth-1-1"))
		if err == nil || time.Since(start) > 2*time.Second {
			t.Fatalf("Create = %v after %v; want a runner timeout after about 300ms", err, time.Since(start))
		}
	})
	t.Run("ctx ends first", func(t *testing.T) {
		fx := newFixture(t, func(c *Config) { c.RunnerTimeout = time.Hour })
		fx.hv.set(func(f *fakeHV) { f.noRunner = true })
		start := time.Now()
		if err := fx.b.Create(deadline(t, 300*time.Millisecond), fx.vm("berth-1-1")); err == nil || time.Since(start) > 2*time.Second {
			t.Fatalf("Create = %v after %v; want ctx's deadline", err, time.Since(start))
		}
	})
	t.Run("boot wedges", func(t *testing.T) {
		fx := newFixture(t, nil)
		fx.hv.set(func(f *fakeHV) { f.boot = wedge })
		start := time.Now()
		err := fx.b.Create(deadline(t, 300*time.Millisecond), fx.vm("berth-1-1"))
		if err == nil || !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
			t.Fatalf("Create = %v after %v; want ctx's deadline", err, time.Since(start))
		}
		if !slices.Equal(fx.b.Live(), []string{"berth-1-1"}) {
			t.Errorf("a guest whose boot overran must still count against the cap: Live = %v", fx.b.Live())
		}
	})
	t.Run("boot fails", func(t *testing.T) {
		fx := newFixture(t, nil)
		fx.hv.set(func(f *fakeHV) { f.boot = fail })
		if err := fx.b.Create(deadline(t, 5*time.Second), fx.vm("berth-1-1")); err == nil {
			t.Fatal("Create succeeded with a failing boot")
		}
	})
	t.Run("guest dies before its runner", func(t *testing.T) {
		fx := newFixture(t, func(c *Config) { c.RunnerTimeout = time.Hour })
		fx.hv.set(func(f *fakeHV) { f.dieAfterBoot = true })
		start := time.Now()
		if err := fx.b.Create(deadline(t, 10*time.Second), fx.vm("berth-1-1")); err == nil || time.Since(start) > 2*time.Second {
			t.Fatalf("Create = %v after %v; want a failure as soon as the guest is off", err, time.Since(start))
		}
	})
}

func TestPhysicalCapIsTwoAndCountsGuestsNotSeenOff(t *testing.T) {
	if _, err := New(Config{BaseImage: "b", ClonesRoot: "c", PhysicalCap: 3}, newFake(t)); err == nil {
		t.Error("New accepted a physical cap of 3")
	}
	fx := newFixture(t, nil)
	if fx.b.PhysicalCap() != 2 {
		t.Fatalf("default cap = %d, want 2", fx.b.PhysicalCap())
	}
	ctx := deadline(t, 10*time.Second)
	must(t, fx.b.Create(ctx, fx.vm("berth-1-1")))
	must(t, fx.b.Create(ctx, fx.vm("berth-2-1")))
	err := fx.b.Create(ctx, fx.vm("berth-3-1"))
	if !errors.Is(err, ErrAtCapacity) {
		t.Fatalf("third Create = %v; want ErrAtCapacity", err)
	}
	if _, err := os.Stat(filepath.Join(fx.root, "berth-3-1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused create made a clone: %v", err)
	}

	// An abandoned guest (both stops wedge) still counts.
	fx.hv.set(func(f *fakeHV) { f.request, f.force = wedge, wedge })
	if err := fx.b.Stop(deadline(t, 300*time.Millisecond), fx.vm("berth-1-1")); !errors.Is(err, ErrAbandoned) {
		t.Fatalf("Stop = %v; want ErrAbandoned", err)
	}
	if err := fx.b.Create(ctx, fx.vm("berth-3-1")); !errors.Is(err, ErrAtCapacity) {
		t.Fatalf("Create beside an abandoned guest = %v; want ErrAtCapacity", err)
	}
	// Once the hypervisor reports it off, its place is free again.
	fx.hv.setState("berth-1-1", StateStopped)
	must(t, fx.b.Create(ctx, fx.vm("berth-3-1")))
}

func TestStopEscalation(t *testing.T) {
	const grace, force = 400 * time.Millisecond, 400 * time.Millisecond
	for _, tc := range []struct {
		name           string
		request, force behaviour
		ctx            time.Duration
		wantErr        error
		wantForce      bool
		within         time.Duration
	}{
		{name: "graceful stop works", request: ok, ctx: 5 * time.Second, within: grace},
		{name: "guest ignores the request", request: ignore, ctx: 5 * time.Second, wantForce: true, within: grace + force},
		{name: "request wedges", request: wedge, ctx: 5 * time.Second, wantForce: true, within: grace + force},
		{name: "request fails", request: fail, ctx: 5 * time.Second, wantForce: true, within: force},
		{name: "request succeeds late", request: late, ctx: 5 * time.Second, wantForce: true, within: grace + force},
		{name: "both wedge", request: wedge, force: wedge, ctx: 5 * time.Second, wantErr: ErrAbandoned, wantForce: true, within: grace + force},
		{name: "force succeeds too late", request: ignore, force: late, ctx: 5 * time.Second, wantErr: ErrAbandoned, wantForce: true, within: grace + force},
		{name: "force fails", request: fail, force: fail, ctx: 5 * time.Second, wantErr: ErrAbandoned, wantForce: true, within: force},
		{name: "both wedge under a short ctx", request: wedge, force: wedge, ctx: 200 * time.Millisecond, wantErr: ErrAbandoned, wantForce: true, within: 200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Given a running guest.
			fx := newFixture(t, func(c *Config) { c.StopGrace, c.ForceTimeout = grace, force })
			must(t, fx.b.Create(deadline(t, 5*time.Second), fx.vm("berth-9-1")))
			fx.hv.set(func(f *fakeHV) { f.request, f.force = tc.request, tc.force })

			// When it is stopped.
			start := time.Now()
			err := fx.b.Stop(deadline(t, tc.ctx), fx.vm("berth-9-1"))
			took := time.Since(start)

			// Then the escalation ends within its bounds and says what happened.
			if tc.wantErr == nil && err != nil || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("Stop = %v; want %v", err, tc.wantErr)
			}
			if slack := 500 * time.Millisecond; took > tc.within+slack {
				t.Errorf("Stop took %v; its bounds allow %v", took, tc.within)
			}
			if got := fx.hv.count("force") > 0; got != tc.wantForce {
				t.Errorf("force stop called: %v, want %v", got, tc.wantForce)
			}
			_, statErr := os.Stat(filepath.Join(fx.root, "berth-9-1"))
			if tc.wantErr == nil {
				if !errors.Is(statErr, os.ErrNotExist) || len(fx.b.Live()) != 0 || fx.hv.held() != 0 {
					t.Errorf("after a stop the clone remains (%v), the guest still counts (%v) or its VM object stays (%d)", statErr, fx.b.Live(), fx.hv.held())
				}
			} else if statErr != nil || len(fx.b.Live()) != 1 || fx.hv.held() != 1 {
				t.Errorf("an abandoned guest must keep its clone (%v), its place (%v) and its VM object (%d)", statErr, fx.b.Live(), fx.hv.held())
			}
			if o := fx.hv.callOrder(); slices.Index(o, "detach") < 0 || slices.Index(o, "detach") > slices.Index(o, "request") {
				t.Errorf("calls %v: the network must be detached before the stop request", o)
			}
		})
	}
}

func TestALateStopIsDischargedByTheNextStop(t *testing.T) {
	fx := newFixture(t, nil)
	must(t, fx.b.Create(deadline(t, 5*time.Second), fx.vm("berth-5-1")))
	fx.hv.set(func(f *fakeHV) { f.request, f.force = ignore, late })
	if err := fx.b.Stop(deadline(t, 200*time.Millisecond), fx.vm("berth-5-1")); !errors.Is(err, ErrAbandoned) {
		t.Fatalf("first Stop = %v; want ErrAbandoned", err)
	}
	// The late force stop lands in the background; the next Stop sees the
	// guest off without asking again, removes its clone and frees its place.
	time.Sleep(lateBy + 100*time.Millisecond)
	requests := fx.hv.count("request")
	must(t, fx.b.Stop(deadline(t, 5*time.Second), fx.vm("berth-5-1")))
	if fx.hv.count("request") != requests {
		t.Error("the second Stop asked an off guest to stop")
	}
	if ids, _ := fx.b.List(context.Background()); len(ids) != 0 || len(fx.b.Live()) != 0 {
		t.Errorf("after the late stop: inventory %v, live %v", ids, fx.b.Live())
	}
}

func TestStopOfAnUnknownGuestRemovesItsCloneOnly(t *testing.T) {
	// A clone left by a previous agent process: the hypervisor has no guest.
	fx := newFixture(t, nil)
	must(t, os.MkdirAll(filepath.Join(fx.root, "berth-3-2", "shared"), 0o700))
	must(t, os.MkdirAll(filepath.Join(fx.root, "berth-3-1"), 0o700))
	must(t, fx.b.Stop(deadline(t, time.Second), fx.vm("berth-3-2")))
	if fx.hv.count("request")+fx.hv.count("force") != 0 {
		t.Error("stop calls for a guest the hypervisor does not know")
	}
	if ids, _ := fx.b.List(context.Background()); !slices.Equal(ids, []string{"berth-3-1"}) {
		t.Errorf("inventory after Stop(berth-3-2) = %v; want only berth-3-1 left (attempts are disjoint)", ids)
	}
}

func TestStopIsBoundedWhenStateWedges(t *testing.T) {
	fx := newFixture(t, nil)
	must(t, fx.b.Create(deadline(t, 5*time.Second), fx.vm("berth-8-1")))
	fx.hv.set(func(f *fakeHV) { f.state, f.request, f.force = wedge, ok, ok })
	start := time.Now()
	err := fx.b.Stop(deadline(t, 500*time.Millisecond), fx.vm("berth-8-1"))
	if !errors.Is(err, ErrAbandoned) || time.Since(start) > 900*time.Millisecond {
		t.Fatalf("Stop = %v after %v; a guest never seen off is abandoned within ctx", err, time.Since(start))
	}
}

func TestNoPlatformHypervisorHereSaysWhatToDo(t *testing.T) {
	if platformHypervisor != nil {
		t.Skip("this build has Virtualization.framework")
	}
	if _, err := NewPlatformHypervisor(4, 8<<30); err == nil {
		t.Fatal("NewPlatformHypervisor succeeded without Virtualization.framework")
	}
}

func TestAGracefulPhaseLongerThanCtxStillLeavesTimeToForce(t *testing.T) {
	// StopGrace and ForceTimeout far beyond what the agent's deadline
	// allows: the graceful phase gets at most half of ctx, so the forced
	// stop still runs and the guest is stopped, not abandoned.
	fx := newFixture(t, func(c *Config) { c.StopGrace, c.ForceTimeout = time.Minute, time.Minute })
	must(t, fx.b.Create(deadline(t, 5*time.Second), fx.vm("berth-6-1")))
	fx.hv.set(func(f *fakeHV) { f.request = wedge })
	start := time.Now()
	if err := fx.b.Stop(deadline(t, 800*time.Millisecond), fx.vm("berth-6-1")); err != nil {
		t.Fatalf("Stop = %v after %v; want the forced stop to end it within ctx", err, time.Since(start))
	}
	if took := time.Since(start); took < 300*time.Millisecond || took > 1500*time.Millisecond {
		t.Errorf("Stop took %v; want about half of ctx for the graceful phase, then the force", took)
	}
}

// killerHV is fakeHV as a Killer: Kill ends the guest (its process's exit
// takes the VM with it) unless kill is wedge.
type killerHV struct {
	*fakeHV
	kill   behaviour
	onKill func()
}

func (k killerHV) Kill(ctx context.Context, a string) error {
	k.onKill()
	if err := k.enter("kill", k.kill); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.states, a)
	delete(k.objects, a)
	return nil
}

// driveFake moves fk on by step whenever a timer is armed, until stop:
// for stops whose every call wedges (nothing real to wait for).
func driveFake(fk *clock.Fake, step time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			armed := fk.Armed()
			if fk.Timers() > 0 {
				fk.Advance(step)
				// Give the code under test its turn before the next step:
				// advancing in a tight loop while its goroutine waited for
				// a core ran fake time past a whole phase under load (the
				// force phase was skipped in a make test). It goes on at
				// once when the code arms a timer, else after 20 ms.
				select {
				case <-done:
					return
				case <-armed:
				case <-time.After(20 * time.Millisecond):
				}
				continue
			}
			select {
			case <-done:
				return
			case <-armed:
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

func TestAStopThatNeverReturnsIsKilledWithinItsDeadline(t *testing.T) {
	const stopTimeout = 2 * time.Minute
	for _, tc := range []struct {
		name      string
		kill      behaviour
		wantEnded string
		wantErr   error
	}{
		{name: "the kill ends it", kill: ok, wantEnded: events.StopKilled},
		{name: "the kill wedges too", kill: wedge, wantErr: ErrAbandoned},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Given a guest whose every stop call wedges, on a fake clock.
			fk := clock.NewFake(time.Now())
			fx := newFixture(t, func(c *Config) {
				c.Clock, c.Poll, c.StopGrace, c.ForceTimeout, c.KillTimeout = fk, time.Second, time.Minute, 30*time.Second, 10*time.Second
				c.RunnerTimeout = 24 * time.Hour // the fake guest's runner starts at once, in real time
			})
			stopClock := driveFake(fk, time.Second)
			must(t, fx.b.Create(deadline(t, 5*time.Second), fx.vm("berth-4-1")))
			stopClock()
			fx.hv.set(func(f *fakeHV) { f.request, f.force = wedge, wedge })
			start := fk.Now()
			ctx, cancel := context.WithDeadline(context.Background(), start.Add(stopTimeout))
			defer cancel()
			killAt := make(chan time.Time, 1)
			fx.b.hv = killerHV{fx.hv, tc.kill, func() {
				killAt <- fk.Now()
				if tc.kill == wedge {
					cancel() // the stop's deadline passes while the kill wedges
				}
			}}

			// When it is stopped under a two-minute deadline.
			stopClock = driveFake(fk, time.Second)
			ended, err := fx.b.StopReport(ctx, fx.vm("berth-4-1"))
			stopClock()

			// Then the kill ends it within the deadline, or it is abandoned
			// and keeps its place.
			if ended != tc.wantEnded || (tc.wantErr == nil) != (err == nil) || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("StopReport = %q, %v; want %q, %v", ended, err, tc.wantEnded, tc.wantErr)
			}
			if took := fk.Now().Sub(start); took > stopTimeout {
				t.Errorf("the stop took %v of fake time; its deadline is %v", took, stopTimeout)
			}
			if at := (<-killAt).Sub(start); at > stopTimeout-10*time.Second {
				t.Errorf("the kill began %v in; the phases before it must leave it its 10s of the %v", at, stopTimeout)
			}
			if fx.hv.count("kill") != 1 || fx.hv.count("force") != 1 {
				t.Errorf("calls: %v; want one force, then one kill", fx.hv.callOrder())
			}
			if tc.wantErr == nil && (len(fx.b.Live()) != 0 || fx.hv.held() != 0) {
				t.Errorf("after the kill: live %v, VM objects %d; want none", fx.b.Live(), fx.hv.held())
			}
			if tc.wantErr != nil && len(fx.b.Live()) != 1 {
				t.Errorf("a guest not seen off must keep its place: live %v", fx.b.Live())
			}
		})
	}
}
