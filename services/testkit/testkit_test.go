package testkit_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/services/vmagent/backend"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testkit.LeakOptions()...)
}

// fakeT records a Fatalf instead of ending the test, so that the kit's
// own failures can be checked. Fatalf runs in the caller's goroutine, so
// the helpers are run in one of their own (see fails).
type fakeT struct {
	testing.TB
	failed string
}

func (f *fakeT) Helper() {}

func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed = format
	panic(f)
}

// fails runs fn with a fakeT and reports whether it called Fatalf.
func fails(t *testing.T, fn func(testing.TB)) (failed bool) {
	f := &fakeT{TB: t}
	defer func() {
		if r := recover(); r != nil {
			if r != any(f) {
				panic(r)
			}
			failed = true
		}
	}()
	fn(f)
	return false
}

// Given a condition that turns true after a few polls, Eventually returns;
// given one that never does, it fails once its window is over.
func TestEventuallyWaitsForTheConditionAndFailsAfterItsWindow(t *testing.T) {
	start := time.Now()
	n := 0
	testkit.Eventually(t, time.Second, "third poll", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("polled %d times, want 3", n)
	}
	if fails(t, func(tb testing.TB) {
		testkit.Eventually(tb, 50*time.Millisecond, "never", func() bool { return false })
	}) == false {
		t.Fatal("a condition that never holds did not fail")
	}
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Fatalf("failed after %v, before its 50ms window", waited)
	}
	if !fails(t, func(tb testing.TB) {
		testkit.EventuallyErr(tb, 20*time.Millisecond, "never", func() error { return errors.New("nope") })
	}) {
		t.Fatal("EventuallyErr did not fail")
	}
}

// Given a condition that breaks midway, Consistently fails; one that holds
// throughout passes after the window.
func TestConsistentlyFailsTheMomentItsConditionBreaks(t *testing.T) {
	testkit.Consistently(t, 30*time.Millisecond, "holds", func() bool { return true })
	n := 0
	if !fails(t, func(tb testing.TB) {
		testkit.Consistently(tb, time.Second, "breaks", func() bool { n++; return n < 3 })
	}) {
		t.Fatal("a breaking condition passed")
	}
}

// Given a history written with the builder, then its facts carry the
// sequence, subject and id the log would give them, and fold into a fleet
// where the job ran and is over.
func TestHistoryStampsFactsAsTheLogWould(t *testing.T) {
	h := testkit.History().HostOnline("h-a", 2, 2).Done(7, "h-a", "success")
	evs := h.Events()
	if len(evs) != 12 {
		t.Fatalf("%d facts, want 11 and the host's grant", len(evs))
	}
	seq := 0
	for i, e := range evs {
		if e.Type() != events.TypeHostGranted { // a grant shares its announcement's sequence
			seq++
		}
		if e.Seq != uint64(seq) || e.Subject != events.SubjectBy(e.Data, events.Authors(e.Type())[0]) || e.ID != e.Data.EventID() ||
			!e.Time.Equal(testkit.T0.Add(time.Duration(seq)*time.Second)) {
			t.Fatalf("fact %d stamped %d %s %s %v", i+1, e.Seq, e.Subject, e.ID, e.Time)
		}
	}
	f := h.Fleet()
	if vs := f.Check(); len(vs) > 0 {
		t.Fatalf("invariants: %v", vs)
	}
	if p := f.Status().Pools; len(p) != 1 || p[0].Held != 0 {
		t.Fatalf("pools %+v, want linux with nothing held", p)
	}
	at := testkit.History().At(time.Minute).Queued(1).Events()[0].Time
	if !at.Equal(testkit.T0.Add(time.Minute)) {
		t.Fatalf("At: stamped %v", at)
	}
	if e := testkit.History().Add(&events.JobQueued{JobRef: testkit.JobRef(3, "gpu")}).Events()[0]; e.Subject != events.JobSubject(3) {
		t.Fatalf("Add: subject %s", e.Subject)
	}
}

// Given a logger from Logs, when code logs with attributes (and groups),
// then Has finds the line by message and attributes, and not otherwise.
func TestLogsRecordsMessagesAndAttributes(t *testing.T) {
	logger, rec := testkit.Logs(t)
	logger.With("pool", "linux").WithGroup("job").Info("demand waiting", "id", 7, slog.Duration("for", 30*time.Second))
	if !rec.Has("demand waiting", "pool", "linux", "job.id", 7, "job.for", "30s") {
		t.Fatalf("line not found in:\n%s", rec)
	}
	if rec.Has("demand waiting", "pool", "mac") || rec.Has("slot leak") {
		t.Fatalf("found a line that was not logged in:\n%s", rec)
	}
}

// Given the fake backend told to fail one create and hang one stop, then
// each call does so, calls and live VMs are counted, and Release ends the
// hung call.
func TestBackendDoesWhatItIsTold(t *testing.T) {
	be := testkit.NewBackend(t)
	var _ backend.Backend = be
	ctx := context.Background()
	jit := filepath.Join(t.TempDir(), "jit")
	if err := os.WriteFile(jit, []byte("cfg"), 0o600); err != nil {
		t.Fatal(err)
	}
	vm := func(a string) backend.VM { return backend.VM{Attempt: a, JITConfigFile: jit} }
	be.SetBehaviour(testkit.StepCreate, "a-2", testkit.Fail)
	be.SetBehaviour(testkit.StepStop, "a-1", testkit.Hang)
	if err := be.Create(ctx, vm("a-1")); err != nil {
		t.Fatal(err)
	}
	if err := be.Create(ctx, vm("a-2")); !errors.Is(err, testkit.ErrFake) {
		t.Fatalf("create a-2: %v, want ErrFake", err)
	}
	if live := be.Live(); !slices.Equal(live, []string{"a-1"}) {
		t.Fatalf("live %v", live)
	}
	if c := be.Calls(testkit.StepCreate, "a-1"); len(c) != 1 || string(c[0].JIT) != "cfg" || c[0].JITMode != 0o600 {
		t.Fatalf("calls %+v", c)
	}
	done := make(chan error, 1)
	go func() { done <- be.Stop(ctx, vm("a-1")) }()
	testkit.Eventually(t, time.Second, "stop called", func() bool { return be.Count(testkit.StepStop) == 1 })
	select {
	case err := <-done:
		t.Fatalf("hung stop returned: %v", err)
	case <-time.After(20 * time.Millisecond): // the hang is the behaviour under test
	}
	be.Release()
	if err := <-done; !errors.Is(err, testkit.ErrFake) {
		t.Fatalf("released stop: %v", err)
	}
	if got, _ := be.List(ctx); !slices.Equal(got, []string{"a-1"}) {
		t.Fatalf("list %v: a failed stop leaves the VM live", got)
	}
}

// Given NATS from the kit, then JetStream answers and the Berth stream can
// be made; the server ends at cleanup (goleak checks).
func TestNATSServesJetStream(t *testing.T) {
	js, app := testkit.Log(t, "test")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, err := app.Append(ctx, app.New(testkit.T0, events.JobQueued{JobRef: testkit.JobRef(1)}), nil); err != nil {
		t.Fatal(err)
	}
	f, err := eventlog.Replay(ctx, js, nil)
	if err != nil || len(f.Jobs) != 1 {
		t.Fatalf("replay: %v, %d jobs", err, len(f.Jobs))
	}
}
