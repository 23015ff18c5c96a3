package vmagent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/sealing"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/services/vmagent"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

func TestPlacementStartsARunnerWithTheOpenedJITConfig(t *testing.T) {
	t.Parallel()
	// Given an agent online and a placement sealed to its curve key.
	h := newHarness(t, nil)
	jit := []byte(`{"name":"berth-101-1","encoded_jit_config":"c2VjcmV0"}`)
	h.place(t, h.host, "berth-101-1", 101, jit)

	// Then it records provisioning, then the runner started.
	prov := h.wait(t, "berth-101-1", events.TypeAttemptProvisioning)
	started := h.wait(t, "berth-101-1", events.TypeAttemptRunnerStarted)
	if prov.Seq >= started.Seq {
		t.Errorf("provisioning at seq %d, runner started at %d: provisioning must come first", prov.Seq, started.Seq)
	}
	// And the backend got the opened JIT config, 0600, in a dir of the attempt's own.
	calls := h.be.Calls("create", "berth-101-1")
	if len(calls) != 1 {
		t.Fatalf("create called %d times, want 1", len(calls))
	}
	c := calls[0]
	if c.JITErr != nil || !bytes.Equal(c.JIT, jit) {
		t.Errorf("JIT config file held %q (%v), want the sealed plaintext %q", c.JIT, c.JITErr, jit)
	}
	if c.JITMode != 0o600 {
		t.Errorf("JIT config file mode %v, want 0600", c.JITMode)
	}
	if filepath.Base(c.VM.WorkDir) != "berth-101-1" || filepath.Dir(c.VM.JITConfigFile) != c.VM.WorkDir {
		t.Errorf("work dir %q, JIT file %q: want both named after the attempt (law 4)", c.VM.WorkDir, c.VM.JITConfigFile)
	}
	if c.VM.Attempt != "berth-101-1" || c.VM.Pool != "linux" || c.VM.Host != h.host || c.VM.JobID != 101 ||
		!slices.Equal(c.VM.Labels, []string{"self-hosted", "linux"}) {
		t.Errorf("backend saw VM %+v", c.VM)
	}
}

func TestJITSealedToAnotherKeyFailsWithoutCreating(t *testing.T) {
	t.Parallel()
	// Given a placement sealed to some other agent's key.
	h := newHarness(t, nil)
	other, _ := nkeys.CreateCurveKeys()
	h.agentKey, _ = other.PublicKey()
	h.place(t, h.host, "berth-102-1", 102, []byte("jit"))

	// Then the attempt fails at open_jit and the backend is never asked to create.
	f := h.wait(t, "berth-102-1", events.TypeAttemptFailed).Data.(*events.AttemptFailed)
	if f.Step != "open_jit" {
		t.Errorf("failed step %q, want open_jit", f.Step)
	}
	if n := len(h.be.Calls("create", "berth-102-1")); n != 0 {
		t.Errorf("create called %d times for a JIT the agent could not open", n)
	}
}

func TestCreateFailureIsRecordedAsFailedStepCreate(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.be.SetBehaviour("create", "berth-103-1", testkit.Fail)
	h.place(t, h.host, "berth-103-1", 103, []byte("jit"))

	f := h.wait(t, "berth-103-1", events.TypeAttemptFailed).Data.(*events.AttemptFailed)
	if f.Step != "create" || !strings.Contains(f.Error, "out of disk") {
		t.Errorf("failed step %q error %q, want step create with the backend's error", f.Step, f.Error)
	}
	if got := h.attemptFacts("berth-103-1", events.TypeAttemptRunnerStarted); len(got) != 0 {
		t.Errorf("a failed create was also recorded as started: %v", got)
	}
}

func TestWedgedCreateIsAbandonedWhileAnotherPlacementProceeds(t *testing.T) {
	t.Parallel()
	// Given a create that never returns, under a deadline long enough to
	// serve another placement meanwhile.
	const timeout = time.Second
	h := newHarness(t, func(o *vmagent.Options) { o.CreateTimeout = timeout })
	h.be.SetBehaviour("create", "berth-104-1", testkit.Hang)
	h.place(t, h.host, "berth-104-1", 104, []byte("jit"))
	h.waitCalls(t, "create", "berth-104-1", 1)

	// When another attempt is placed while it hangs.
	h.place(t, h.host, "berth-105-1", 105, []byte("jit"))

	// Then the other attempt's runner starts before the hung one is abandoned (law 3).
	started := h.wait(t, "berth-105-1", events.TypeAttemptRunnerStarted)
	ab := h.wait(t, "berth-104-1", events.TypeAttemptAbandoned)
	if started.Seq > ab.Seq {
		t.Errorf("runner of berth-105-1 started at seq %d, after berth-104-1 was abandoned at %d: the loop waited on the hung create", started.Seq, ab.Seq)
	}
	if d := ab.Data.(*events.AttemptAbandoned); d.Step != "create" || d.After != timeout {
		t.Errorf("abandoned step %q after %v, want create after %v", d.Step, d.After, timeout)
	}
	for _, typ := range []string{events.TypeAttemptRunnerStarted, events.TypeAttemptFailed} {
		if got := h.attemptFacts("berth-104-1", typ); len(got) != 0 {
			t.Errorf("abandoned create also recorded %s", typ)
		}
	}
}

func TestTeardownStopsTheVMExactlyOnce(t *testing.T) {
	t.Parallel()
	// Given a running attempt.
	h := newHarness(t, nil)
	h.place(t, h.host, "berth-106-1", 106, []byte("jit"))
	h.wait(t, "berth-106-1", events.TypeAttemptRunnerStarted)

	// When its teardown is requested.
	h.teardown(t, "berth-106-1")

	// Then the backend stops it, the work dir is removed, and it is recorded stopped.
	st := h.wait(t, "berth-106-1", events.TypeAttemptStopped).Data.(*events.AttemptStopped)
	if st.Late {
		t.Error("a stop within its deadline was recorded late")
	}
	if _, err := os.Stat(h.dirOf("berth-106-1")); !os.IsNotExist(err) {
		t.Errorf("work dir of a stopped attempt: %v, want it removed", err)
	}
	// And after more turns of the loop (another whole lifecycle), Stop was
	// still called only once for it.
	h.place(t, h.host, "berth-107-1", 107, []byte("jit"))
	h.wait(t, "berth-107-1", events.TypeAttemptRunnerStarted)
	h.teardown(t, "berth-107-1")
	h.wait(t, "berth-107-1", events.TypeAttemptStopped)
	for _, a := range []string{"berth-106-1", "berth-107-1"} {
		if n := len(h.be.Calls("stop", a)); n != 1 {
			t.Errorf("stop of %s called %d times, want exactly 1", a, n)
		}
	}
}

func TestWedgedStopIsAbandonedWhileAnotherTeardownCompletes(t *testing.T) {
	t.Parallel()
	// Given two running attempts, the first one's stop hanging forever.
	const timeout = time.Second
	h := newHarness(t, func(o *vmagent.Options) { o.StopTimeout = timeout })
	for i, a := range []string{"berth-108-1", "berth-109-1"} {
		h.place(t, h.host, a, int64(108+i), []byte("jit"))
		h.wait(t, a, events.TypeAttemptRunnerStarted)
	}
	h.be.SetBehaviour("stop", "berth-108-1", testkit.Hang)

	// When both are torn down, the second while the first's stop hangs.
	h.teardown(t, "berth-108-1")
	h.waitCalls(t, "stop", "berth-108-1", 1)
	h.teardown(t, "berth-109-1")

	// Then the second is stopped before the first is abandoned (law 3).
	stopped := h.wait(t, "berth-109-1", events.TypeAttemptStopped)
	ab := h.wait(t, "berth-108-1", events.TypeAttemptAbandoned)
	if stopped.Seq > ab.Seq {
		t.Errorf("berth-109-1 stopped at seq %d, after berth-108-1 was abandoned at %d: the loop waited on the hung stop", stopped.Seq, ab.Seq)
	}
	if d := ab.Data.(*events.AttemptAbandoned); d.Step != "stop" || d.After != timeout {
		t.Errorf("abandoned step %q after %v, want stop after %v", d.Step, d.After, timeout)
	}
	// And the abandoned VM is not claimed stopped, nor stopped again, after more turns.
	h.place(t, h.host, "berth-110-1", 110, []byte("jit"))
	h.wait(t, "berth-110-1", events.TypeAttemptRunnerStarted)
	if got := h.attemptFacts("berth-108-1", events.TypeAttemptStopped); len(got) != 0 {
		t.Error("an abandoned stop was recorded as stopped")
	}
	for _, a := range []string{"berth-108-1", "berth-109-1"} {
		if n := len(h.be.Calls("stop", a)); n != 1 {
			t.Errorf("stop of %s called %d times, want exactly 1", a, n)
		}
	}
}

func TestTeardownOfAnUnprovisionedAttemptNeedsNoBackend(t *testing.T) {
	t.Parallel()
	// Given a slot booked but never placed (the mint failed, say).
	h := newHarness(t, nil)
	h.append(t, events.SlotReserved{Pool: "linux", Host: h.host, Attempt: "berth-111-1", JobID: 111, N: 1})

	// When its teardown is requested, then it is stopped without a backend call.
	h.teardown(t, "berth-111-1")
	h.wait(t, "berth-111-1", events.TypeAttemptStopped)
	if n := len(h.be.Calls("stop", "berth-111-1")) + len(h.be.Calls("create", "berth-111-1")); n != 0 {
		t.Errorf("backend called %d times for an attempt that never had a VM", n)
	}
}

func TestRestartedAgentDoesNotCreateATornDownPlacement(t *testing.T) {
	t.Parallel()
	// Given a placement and its teardown appended while the agent was down.
	h := newHarness(t, nil)
	h.stop()
	h.place(t, h.host, "berth-112-1", 112, []byte("jit"))
	h.teardown(t, "berth-112-1")

	// When the agent comes back, then it records the attempt stopped and
	// calls the backend for neither create nor stop.
	h.startAgent(t)
	h.wait(t, "berth-112-1", events.TypeAttemptStopped)
	if got := h.attemptFacts("berth-112-1", events.TypeAttemptProvisioning); len(got) != 0 {
		t.Error("a torn-down placement was provisioned")
	}
	if n := len(h.be.Calls("stop", "berth-112-1")) + len(h.be.Calls("create", "berth-112-1")); n != 0 {
		t.Errorf("backend called %d times for a placement torn down before it was seen", n)
	}
}

func TestPlacementForAnotherHostIsNotTaken(t *testing.T) {
	t.Parallel()
	// Given a placement for host-b (even sealed to this agent's key), then one for this host.
	h := newHarness(t, nil)
	h.place(t, "host-b", "berth-113-1", 113, []byte("jit"))
	h.place(t, h.host, "berth-114-1", 114, []byte("jit"))

	// When this agent has served its own placement (which it sees after the other).
	h.wait(t, "berth-114-1", events.TypeAttemptRunnerStarted)

	// Then it never touched the other host's attempt.
	if n := len(h.be.Calls("create", "berth-113-1")); n != 0 {
		t.Errorf("agent of %s created an attempt placed on host-b", h.host)
	}
	if got := h.find(func(e events.Event) bool {
		return strings.HasSuffix(e.ID, "berth-113-1/provisioning") || strings.HasPrefix(e.Subject, events.AttemptSubject(h.host, "berth-113-1")+".")
	}); len(got) != 0 {
		t.Errorf("agent recorded facts for host-b's attempt: %v", got)
	}
}

func TestEveryPlacementIsCreatedExactlyOnce(t *testing.T) {
	t.Parallel()
	// Given a burst of placements whose creates return at once (so results
	// race the fold of their own provisioning facts).
	h := newHarness(t, func(o *vmagent.Options) { o.CreateTimeout = 5 * time.Second })
	const n = 30
	for i := range n {
		h.place(t, h.host, fmt.Sprintf("berth-%d-1", 200+i), int64(200+i), []byte("jit"))
	}
	// Then every runner starts, and each VM was created exactly once (law 9).
	for i := range n {
		h.wait(t, fmt.Sprintf("berth-%d-1", 200+i), events.TypeAttemptRunnerStarted)
	}
	for i := range n {
		a := fmt.Sprintf("berth-%d-1", 200+i)
		if c := len(h.be.Calls("create", a)); c != 1 {
			t.Errorf("create of %s called %d times, want exactly 1", a, c)
		}
	}
}

func TestAgentHeartbeatsUnderItsHostName(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	boot := h.find(func(e events.Event) bool { _, ok := e.Data.(*events.HostOnline); return ok })[0].Data.(*events.HostOnline).Boot

	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	// Wait until the bucket holds a second heartbeat: the agent keeps beating.
	var e jetstream.KeyValueEntry
	testkit.EventuallyErr(t, waitLimit, "a repeated heartbeat in "+events.BucketHeartbeats+"/"+h.host, func() error {
		kv, err := h.js.KeyValue(ctx, events.BucketHeartbeats)
		if err != nil {
			return err
		}
		if e, err = kv.Get(ctx, h.host); err == nil && e.Revision() < 2 {
			err = fmt.Errorf("revision %d", e.Revision())
		}
		return err
	})
	var hb events.Heartbeat
	if err := json.Unmarshal(e.Value(), &hb); err != nil {
		t.Fatalf("heartbeat %q: %v", e.Value(), err)
	}
	if hb.Host != h.host || hb.Boot != boot || hb.At.IsZero() {
		t.Errorf("heartbeat %+v, want host %s boot %s and a time", hb, h.host, boot)
	}
}

// Given a backend with a physical limit of its own (vz: 2 macOS guests),
// when the agent's physical_cap asks for more, then the host is advertised
// with the backend's limit; when it asks for less, its own. A backend with
// no limit (0) leaves physical_cap as configured.
func TestAgentAdvertisesTheSmallerOfItsAndTheBackendsPhysicalCap(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	advertised := func() int {
		all := h.find(func(e events.Event) bool { _, ok := e.Data.(*events.HostOnline); return ok })
		return all[len(all)-1].Data.(*events.HostOnline).PhysicalCap
	}
	if got := advertised(); got != 4 {
		t.Fatalf("backend without a limit: physical cap %d, want the configured 4", got)
	}
	for _, c := range []struct{ configured, backend, want int }{{4, 2, 2}, {1, 2, 1}, {0, 2, 2}} {
		h.stop()
		h.be.SetPhysicalCap(c.backend)
		h.opts.PhysicalCap = c.configured
		h.startAgent(t)
		if got := advertised(); got != c.want {
			t.Errorf("physical_cap %d, backend limit %d: advertised %d, want %d", c.configured, c.backend, got, c.want)
		}
	}
}

// Given an agent whose backend can assign (issue 8), when a warm VM is
// placed, then it is created without a JIT config (vm.Warm, no file) and
// reported ready, not as a started runner; when the dispatcher hands it a
// JIT config, the backend's assign step gets the opened config in the
// attempt's own 0600 file, the runner is reported started, and create is
// never called again. The host advertises that it can keep warm VMs.
func TestAWarmVMBootsWithoutAJITConfigAndStartsItsRunnerOnAssign(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	online := h.find(func(e events.Event) bool { _, ok := e.Data.(*events.HostOnline); return ok })
	if len(online) == 0 || !online[len(online)-1].Data.(*events.HostOnline).Assign {
		t.Fatal("the host does not advertise that it can keep warm VMs")
	}
	const id = "berth-warm-linux-1"
	r := events.AttemptRef{Attempt: id, Pool: "linux", Host: h.host}
	labels := []string{"self-hosted", "linux"}
	h.append(t, events.SlotReserved{Pool: "linux", Host: h.host, Attempt: id, N: 1, Labels: labels, Warm: true})
	h.append(t, events.AttemptPlaced{AttemptRef: r, Labels: labels, Warm: true})
	h.wait(t, id, events.TypeAttemptReady)
	creates := h.be.Calls("create", id)
	if len(creates) != 1 || !creates[0].VM.Warm || creates[0].VM.JITConfigFile != "" {
		t.Fatalf("create calls %+v: want one, warm, with no JIT config file", creates)
	}
	if got := h.attemptFacts(id, events.TypeAttemptRunnerStarted); len(got) != 0 {
		t.Fatalf("a warm VM with no job reported a started runner: %v", got)
	}

	jit := []byte(`{"name":"berth-warm-linux-1","encoded_jit_config":"d2FybQ=="}`)
	sealed, err := sealing.Seal(h.sealer, h.agentKey, sealing.Placement{Attempt: id, Host: h.host, Pool: "linux", JobID: 77, BookedSeq: 1, JIT: jit})
	if err != nil {
		t.Fatal(err)
	}
	by, _ := h.sealer.PublicKey()
	h.append(t, events.AttemptClaimed{Pool: "linux", Host: h.host, Attempt: id, JobID: 77})
	h.append(t, events.AttemptAssigned{AttemptRef: r, JobID: 77, RunnerID: 770, SealedJIT: sealed, SealedBy: by, SealedTo: h.agentKey})
	h.wait(t, id, events.TypeAttemptRunnerStarted)
	assigns := h.be.Calls("assign", id)
	if len(assigns) != 1 || !bytes.Equal(assigns[0].JIT, jit) || assigns[0].JITMode != 0o600 ||
		filepath.Dir(assigns[0].VM.JITConfigFile) != assigns[0].VM.WorkDir {
		t.Fatalf("assign calls %+v: want one, with the opened JIT config in the attempt's own 0600 file", assigns)
	}
	if n := len(h.be.Calls("create", id)); n != 1 {
		t.Fatalf("create called %d times, want once: the VM already runs", n)
	}
}

// inMemoryBackend is the fake backend taking its JIT configs in memory,
// as ec2 does (backend.InMemoryJIT).
type inMemoryBackend struct{ *testkit.Backend }

func (inMemoryBackend) InMemoryJIT() {}

// Given an agent whose backend takes the JIT config in memory, when a
// placement is created and torn down, then the backend gets the opened
// config in the VM itself and no file path, and the agent kept nothing of
// the attempt on the host's disk at any point: the runner's credential
// never touched it. A JIT config file an earlier build wrote (ec2 before
// it took them in memory) is gone once the agent has started.
func TestAnInMemoryBackendGetsTheJITConfigAndTheHostDiskNothing(t *testing.T) {
	t.Parallel()
	be := testkit.NewBackend(t)
	var left string // a JIT config file an earlier build wrote for an attempt
	h := newHarnessOn(t, inMemoryBackend{be}, func(o *vmagent.Options) {
		left = filepath.Join(o.DataDir, "attempts", "berth-110-1", "jitconfig")
		if err := os.MkdirAll(filepath.Dir(left), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(left, []byte("secret"), 0o600); err != nil {
			t.Fatal(err)
		}
	})
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Errorf("a JIT config file an earlier build left: %v; want it removed when the agent starts", err)
	}
	jit := []byte(`{"name":"berth-111-1","encoded_jit_config":"c2VjcmV0"}`)
	h.place(t, h.host, "berth-111-1", 111, jit)
	h.wait(t, "berth-111-1", events.TypeAttemptRunnerStarted)

	calls := be.Calls("create", "berth-111-1")
	if len(calls) != 1 {
		t.Fatalf("create called %d times, want 1", len(calls))
	}
	if vm := calls[0].VM; !bytes.Equal(vm.JITConfig, jit) || vm.JITConfigFile != "" || vm.WorkDir != "" {
		t.Errorf("backend saw JIT config %q, file %q, work dir %q; want the opened config and no paths", vm.JITConfig, vm.JITConfigFile, vm.WorkDir)
	}
	if kept, err := os.ReadDir(filepath.Join(h.opts.DataDir, "attempts")); err != nil || len(kept) != 0 {
		t.Errorf("the agent's attempts directory holds %v (%v) while the runner runs; want nothing", kept, err)
	}

	h.teardown(t, "berth-111-1")
	h.wait(t, "berth-111-1", events.TypeAttemptStopped)
	if n := len(be.Calls("stop", "berth-111-1")); n != 1 {
		t.Errorf("stop called %d times, want 1", n)
	}
}
