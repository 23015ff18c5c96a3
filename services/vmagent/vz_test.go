package vmagent_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/clock"
	"github.com/berth-ci/berth/services/sealing"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/services/vmagent"
	"github.com/berth-ci/berth/services/vmagent/backends/vz"
	"github.com/berth-ci/berth/services/vmagent/backends/vz/vztest"
)

// A macOS host of one guest place, on the vz backend with real helper
// processes (this test binary re-executed) and a fake hypervisor in each:
// the first guest's stop calls never return, like the framework's wedged
// stop. Its teardown kills its helper within the stop deadline, records
// the stop as killed, and the next job boots on the same host.
// vzHost is a harness whose agent runs the vz backend over real helper
// processes (this test binary re-executed), each with a fake hypervisor
// whose stops behave as mode(attempt) says; the backend's phases run on
// fk. The host has one guest place.
type vzHost struct {
	*harness
	helpers *vz.Helpers
	fk      *clock.Fake
	clones  string
}

const vzStopTimeout, vzPoll = 2 * time.Minute, time.Second

func newVZHost(t *testing.T, mode func(attempt string) string) *vzHost {
	return newVZHostWith(t, mode, nil, nil)
}

// newVZHostWith is newVZHost with the backend's config and the agent's
// options changed by cfg and opts (nil: as they are).
func newVZHostWith(t *testing.T, mode func(attempt string) string, cfg func(*vz.Config), opts func(*vmagent.Options)) *vzHost {
	t.Helper()
	dir := t.TempDir()
	base := filepath.Join(dir, "base")
	if err := os.MkdirAll(base, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, "disk.img"), []byte("disk"), 0o644); err != nil {
		t.Fatal(err)
	}
	helpers := &vz.Helpers{Command: vztest.Command(mode)}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		_ = helpers.Close(ctx)
	})
	fk := clock.NewFake(time.Now())
	clones := filepath.Join(dir, "clones")
	// RunnerTimeout is a day of fake time: only Drive moves it, and only
	// once the fake guest has written what the backend waits for.
	c := vz.Config{BaseImage: base, ClonesRoot: clones, PhysicalCap: 1,
		RunnerTimeout: 24 * time.Hour, StopGrace: time.Minute, ForceTimeout: 30 * time.Second, KillTimeout: 10 * time.Second,
		Poll: vzPoll, Clock: fk}
	if cfg != nil {
		cfg(&c)
	}
	b, err := vz.New(c, helpers)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarnessOn(t, b, func(o *vmagent.Options) {
		o.PhysicalCap, o.CreateTimeout, o.StopTimeout = 1, time.Minute, vzStopTimeout
		if opts != nil {
			opts(o)
		}
	})
	return &vzHost{harness: h, helpers: helpers, fk: fk, clones: clones}
}

// A macOS host of one guest place whose first guest's stop calls never
// return, like the framework's wedged stop. Its teardown kills its helper
// within the stop deadline, records the stop as killed, and the next job
// boots on the same host.
func TestAWedgedMacOSGuestIsKilledAndTheNextJobBootsOnItsHost(t *testing.T) {
	const stopTimeout, poll = vzStopTimeout, vzPoll
	v := newVZHost(t, func(attempt string) string {
		if attempt == "berth-1-1" {
			return vztest.WedgedStop
		}
		return vztest.Stops
	})
	h, fk, helpers := v.harness, v.fk, v.helpers

	// Given a job running on the host's one guest.
	h.place(t, h.host, "berth-1-1", 1, []byte("jit-1"))
	h.wait(t, "berth-1-1", events.TypeAttemptRunnerStarted)

	// When its job ends and the guest's stop never returns (the fake clock
	// runs on through the stop's phases; only a wedged stop needs it).
	fk.Set(time.Now()) // the stop's deadline is on the wall clock: start the fake one level with it
	start := fk.Now()
	stopClock := vztest.Drive(fk, poll)
	h.teardown(t, "berth-1-1")
	stopped := h.wait(t, "berth-1-1", events.TypeAttemptStopped).Data.(*events.AttemptStopped)
	stopClock()

	// Then the stop ended by killing the helper, within the stop deadline,
	// and the VM was never abandoned.
	if stopped.Ended != events.StopKilled || stopped.Late {
		t.Errorf("stopped fact = %+v; want ended %q, not late", stopped, events.StopKilled)
	}
	if took := fk.Now().Sub(start); took > stopTimeout {
		t.Errorf("the stop took %v of fake time; the deadline is %v", took, stopTimeout)
	}
	if ab := h.attemptFacts("berth-1-1", events.TypeAttemptAbandoned); len(ab) != 0 {
		t.Errorf("the VM was abandoned: %v", ab)
	}

	// And the next job boots on that host (its one place came back), and
	// stops cleanly, leaving no helper and so no VM object.
	h.place(t, h.host, "berth-2-1", 2, []byte("jit-2"))
	h.wait(t, "berth-2-1", events.TypeAttemptRunnerStarted)
	h.teardown(t, "berth-2-1")
	stopped = h.wait(t, "berth-2-1", events.TypeAttemptStopped).Data.(*events.AttemptStopped)
	if stopped.Ended != events.StopClean {
		t.Errorf("the next guest's stopped fact = %+v; want ended %q", stopped, events.StopClean)
	}
	if got := helpers.Running(); len(got) != 0 {
		t.Errorf("helpers (VM objects) left: %v", got)
	}
}

// A warm macOS guest: booted without a job, its daemon waiting; a job's
// assign reaches it through the share, its runner starts, and its stop is
// clean and leaves no helper.
func TestAWarmMacOSGuestIsAssignedThroughTheShare(t *testing.T) {
	v := newVZHost(t, func(string) string { return vztest.Stops })
	online := v.find(func(e events.Event) bool { _, ok := e.Data.(*events.HostOnline); return ok })
	if len(online) == 0 || !online[len(online)-1].Data.(*events.HostOnline).Assign {
		t.Fatal("the vz host does not advertise that it can keep warm VMs")
	}
	const id = "berth-warm-linux-1"
	r := events.AttemptRef{Attempt: id, Pool: "linux", Host: v.host}
	labels := []string{"self-hosted", "linux"}
	v.append(t, events.SlotReserved{Pool: "linux", Host: v.host, Attempt: id, N: 1, Labels: labels, Warm: true})
	v.append(t, events.AttemptPlaced{AttemptRef: r, Labels: labels, Warm: true})
	v.wait(t, id, events.TypeAttemptReady)
	shared := filepath.Join(v.clones, id, vz.SharedDir)
	if _, err := os.Stat(filepath.Join(shared, vz.JITConfigName)); !os.IsNotExist(err) {
		t.Fatalf("a warm guest has a JIT config before a job claimed it: %v", err)
	}

	jit := []byte(`{"name":"berth-warm-linux-1","encoded_jit_config":"d2FybQ=="}`)
	sealed, err := sealing.Seal(v.sealer, v.agentKey, sealing.Placement{Attempt: id, Host: v.host, Pool: "linux", JobID: 77, BookedSeq: 1, JIT: jit})
	if err != nil {
		t.Fatal(err)
	}
	by, _ := v.sealer.PublicKey()
	v.append(t, events.AttemptClaimed{Pool: "linux", Host: v.host, Attempt: id, JobID: 77})
	v.append(t, events.AttemptAssigned{AttemptRef: r, JobID: 77, RunnerID: 770, SealedJIT: sealed, SealedBy: by, SealedTo: v.agentKey})
	testkit.Eventually(t, waitLimit, "the guest's daemon starts its runner", func() bool {
		_, err := os.Stat(filepath.Join(shared, vz.RunnerStarted))
		return err == nil
	})
	stopClock := vztest.Drive(v.fk, vzPoll) // the backend sees it at its next poll
	v.wait(t, id, events.TypeAttemptRunnerStarted)
	stopClock()
	if got, err := os.ReadFile(filepath.Join(shared, vz.JITConfigName)); err != nil || !bytes.Equal(got, jit) {
		t.Errorf("JIT config on the share = %q, %v; want the job's", got, err)
	}

	v.append(t, events.SlotReleased{Pool: "linux", Host: v.host, Attempt: id, Reason: events.ReleaseCompleted})
	v.append(t, events.AttemptTeardownRequested{AttemptRef: r, Reason: events.ReleaseCompleted})
	stopped := v.wait(t, id, events.TypeAttemptStopped).Data.(*events.AttemptStopped)
	if stopped.Ended != events.StopClean {
		t.Errorf("stopped fact %+v; want ended %q", stopped, events.StopClean)
	}
	if got := v.helpers.Running(); len(got) != 0 {
		t.Errorf("helpers (VM objects) left: %v", got)
	}
}

// A macOS host whose pool offers a shape (berth-size-l on the
// xcode-16 image, 8 CPUs, 16 GiB): a placement in that shape's pool boots,
// through the agent and a real helper process, a guest from the xcode-16
// image with the shape's CPUs and memory; a placement in the plain pool
// boots the base image at the backend's size.
func TestAMacOSJobOfAShapeBootsItsMachine(t *testing.T) {
	var xcode string
	v := newVZHostWith(t, func(string) string { return vztest.Stops }, func(c *vz.Config) {
		xcode = filepath.Join(filepath.Dir(c.BaseImage), "xcode-16")
		if err := os.MkdirAll(xcode, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(xcode, "disk.img"), []byte("xcode-16 disk"), 0o644); err != nil {
			t.Fatal(err)
		}
		c.Images, c.CPUs, c.Memory = map[string]string{"xcode-16": xcode}, 4, 8<<30
	}, func(o *vmagent.Options) {
		o.Pools = map[string]events.PoolSlots{
			"macos":         {Labels: []string{"macos", "self-hosted"}, Slots: 1},
			"macos-xcode16": {Labels: []string{"berth-size-l", "macos", "self-hosted"}, Slots: 1, Shape: &events.Shape{CPU: 8, MemoryMiB: 16384, Image: "xcode-16"}},
		}
	})
	for _, tc := range []struct {
		pool, attempt string
		job           int64
		disk, machine string
	}{
		{"macos-xcode16", "berth-60-1", 60, "xcode-16 disk", fmt.Sprintf("cpus=8 memory=%d", 16<<30)},
		{"macos", "berth-61-1", 61, "disk", fmt.Sprintf("cpus=4 memory=%d", 8<<30)},
	} {
		v.placeIn(t, tc.pool, tc.attempt, tc.job, []byte("jit"))
		v.wait(t, tc.attempt, events.TypeAttemptRunnerStarted)
		dir := filepath.Join(v.clones, tc.attempt)
		disk, _ := os.ReadFile(filepath.Join(dir, "disk.img"))
		machine, _ := os.ReadFile(filepath.Join(dir, vztest.MachineFile))
		if string(disk) != tc.disk || string(machine) != tc.machine {
			t.Errorf("%s (pool %s) booted disk %q with %q; want disk %q with %q", tc.attempt, tc.pool, disk, machine, tc.disk, tc.machine)
		}
		v.teardown(t, tc.attempt)
		v.wait(t, tc.attempt, events.TypeAttemptStopped)
	}
}
