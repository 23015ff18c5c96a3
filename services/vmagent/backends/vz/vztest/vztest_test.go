package vztest_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/clock"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/services/vmagent/backend"
	"github.com/berth-ci/berth/services/vmagent/backends/vz"
	"github.com/berth-ci/berth/services/vmagent/backends/vz/vztest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	vztest.ServeIfHelper()
	goleak.VerifyTestMain(m)
}

// waitLimit bounds every real wait: far above what a helper's start and
// a round trip need, so only a hang fails.
const waitLimit = 20 * time.Second

// The stop bounds of these tests, on the fake clock.
const (
	stopTimeout = 2 * time.Minute
	poll        = time.Second
)

type fixture struct {
	b    *vz.Backend
	hv   *vz.Helpers
	fk   *clock.Fake
	root string
	jit  string
}

// newFixture is a vz backend over real helper processes (this test binary,
// re-executed) whose guests stop as modes says (default vztest.Stops).
func newFixture(t *testing.T, physicalCap int, modes map[string]string) *fixture {
	t.Helper()
	dir := t.TempDir()
	base := filepath.Join(dir, "base")
	must(t, os.MkdirAll(base, 0o755))
	must(t, os.WriteFile(filepath.Join(base, "disk.img"), []byte("disk"), 0o644))
	jit := filepath.Join(dir, "jitconfig")
	must(t, os.WriteFile(jit, []byte("encoded-jit"), 0o600))
	hv := &vz.Helpers{Command: vztest.Command(func(a string) string {
		if m, ok := modes[a]; ok {
			return m
		}
		return vztest.Stops
	})}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		if err := hv.Close(ctx); err != nil {
			t.Errorf("helpers left running: %v", err)
		}
	})
	fk := clock.NewFake(time.Now())
	b, err := vz.New(vz.Config{BaseImage: base, ClonesRoot: filepath.Join(dir, "clones"), PhysicalCap: physicalCap,
		RunnerTimeout: 10 * time.Minute, StopGrace: time.Minute, ForceTimeout: 30 * time.Second, KillTimeout: 10 * time.Second,
		Poll: poll, Clock: fk}, hv)
	must(t, err)
	return &fixture{b: b, hv: hv, fk: fk, root: filepath.Join(dir, "clones"), jit: jit}
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

// stopCtx is a stop step's context: its deadline stopTimeout away on the
// fake clock (the real one never gets there first).
func (fx *fixture) stopCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithDeadline(context.Background(), fx.fk.Now().Add(stopTimeout))
	t.Cleanup(cancel)
	return ctx
}

func realCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	return ctx
}

func TestAStopThatNeverReturnsKillsTheHelperAndGivesThePlaceBack(t *testing.T) {
	// Given a host of one guest place whose guest's stop calls never return.
	fx := newFixture(t, 1, map[string]string{"berth-1-1": vztest.WedgedStop})
	must(t, fx.b.Create(realCtx(t), fx.vm("berth-1-1")))
	if got := fx.hv.Running(); !slices.Equal(got, []string{"berth-1-1"}) {
		t.Fatalf("helpers running = %v; want one for berth-1-1", got)
	}
	if err := fx.b.Create(realCtx(t), fx.vm("berth-2-1")); !errors.Is(err, vz.ErrAtCapacity) {
		t.Fatalf("second Create on a full host = %v; want ErrAtCapacity", err)
	}

	// When it is stopped under the stop deadline.
	start := fx.fk.Now()
	stopClock := vztest.Drive(fx.fk, poll)
	ended, err := fx.b.StopReport(fx.stopCtx(t), fx.vm("berth-1-1"))
	stopClock()
	took := fx.fk.Now().Sub(start)

	// Then the helper was killed within the deadline, the stop says so, and
	// the place is back: the next guest boots on this host.
	if err != nil || ended != events.StopKilled {
		t.Fatalf("StopReport = %q, %v; want %q", ended, err, events.StopKilled)
	}
	if took > stopTimeout {
		t.Errorf("the stop took %v of fake time; its deadline is %v", took, stopTimeout)
	}
	if got := fx.hv.Running(); len(got) != 0 {
		t.Errorf("helpers still running after the kill: %v", got)
	}
	if _, err := os.Stat(filepath.Join(fx.root, "berth-1-1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the killed guest's clone stays: %v", err)
	}
	must(t, fx.b.Create(realCtx(t), fx.vm("berth-2-1")))
	ended, err = fx.b.StopReport(fx.stopCtx(t), fx.vm("berth-2-1"))
	if err != nil || ended != events.StopClean {
		t.Errorf("the next guest's stop = %q, %v; want %q", ended, err, events.StopClean)
	}
}

func TestGracefulStopsLeaveNoVMObjectBehind(t *testing.T) {
	// Given two guests at once, three times over.
	fx := newFixture(t, 2, nil)
	for round := range 3 {
		a, b := "berth-1-"+string(rune('1'+round)), "berth-2-"+string(rune('1'+round))
		must(t, fx.b.Create(realCtx(t), fx.vm(a)))
		must(t, fx.b.Create(realCtx(t), fx.vm(b)))
		if got := fx.hv.Running(); len(got) != 2 {
			t.Fatalf("round %d: helpers running = %v; want 2", round, got)
		}
		// When both stop (the guests shut down when asked).
		for _, id := range []string{a, b} {
			if ended, err := fx.b.StopReport(fx.stopCtx(t), fx.vm(id)); err != nil || ended != events.StopClean {
				t.Fatalf("round %d: StopReport(%s) = %q, %v; want clean", round, id, ended, err)
			}
		}
		// Then no helper, so no VM object, stays, and no place is held.
		if got := fx.hv.Running(); len(got) != 0 {
			t.Fatalf("round %d: helpers (VM objects) left after graceful stops: %v", round, got)
		}
		if got := fx.b.Live(); len(got) != 0 {
			t.Fatalf("round %d: places held after graceful stops: %v", round, got)
		}
	}
}

func TestAWarmGuestIsAssignedThroughTheShare(t *testing.T) {
	// Given a warm guest: booted without a JIT config, its daemon waiting.
	fx := newFixture(t, 2, nil)
	if !fx.b.CanAssign() {
		t.Fatal("vz says it cannot assign")
	}
	warm := fx.vm("berth-5-1")
	warm.Warm, warm.JITConfigFile = true, ""
	must(t, fx.b.Create(realCtx(t), warm))
	shared := filepath.Join(fx.root, "berth-5-1", vz.SharedDir)
	if _, err := os.Stat(filepath.Join(shared, vz.JITConfigName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a warm guest has a JIT config before its assign: %v", err)
	}

	// When a job's JIT config is assigned to it.
	done := make(chan error, 1)
	go func() { done <- fx.b.Assign(realCtx(t), fx.vm("berth-5-1")) }()

	// Then the guest's daemon picks it up from the share and starts the
	// runner, and Assign sees that at its next poll.
	testkit.Eventually(t, waitLimit, "the guest's runner-started", func() bool {
		_, err := os.Stat(filepath.Join(shared, vz.RunnerStarted))
		return err == nil
	})
	got, err := os.ReadFile(filepath.Join(shared, vz.JITConfigName))
	if err != nil || string(got) != "encoded-jit" {
		t.Errorf("jitconfig on the share = %q, %v", got, err)
	}
	stopClock := vztest.Drive(fx.fk, poll)
	defer stopClock()
	select {
	case err := <-done:
		must(t, err)
	case <-time.After(waitLimit):
		t.Fatal("Assign did not return after the runner started")
	}
}

func TestAssignOfAGuestNotRunningHereFails(t *testing.T) {
	fx := newFixture(t, 2, nil)
	if err := fx.b.Assign(realCtx(t), fx.vm("berth-6-1")); err == nil {
		t.Fatal("Assign of a guest never created succeeded")
	}
}
