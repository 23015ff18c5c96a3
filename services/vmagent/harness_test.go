package vmagent_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"fmt"
	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/sealing"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/services/vmagent"
	"github.com/berth-ci/berth/services/vmagent/backend"
	"github.com/berth-ci/berth/services/vmagent/backends/vz/vztest"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	vztest.ServeIfHelper() // this binary re-executed as a vz guest's helper (vz_test.go)
	goleak.VerifyTestMain(m, testkit.LeakOptions()...)
}

// waitLimit bounds every wait in this package: far above what any step
// needs, so that only a real hang fails a test.
const waitLimit = 10 * time.Second

// recorder follows the whole log into a slice.
type recorder struct {
	mu  sync.Mutex
	evs []events.Event
}

func (r *recorder) snapshot() []events.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]events.Event(nil), r.evs...)
}

// harness is one embedded NATS server, a dispatcher's appender, one agent
// with a fake backend, and a follower of the whole log.
type harness struct {
	host     string
	js       jetstream.JetStream
	app      *eventlog.Appender
	be       *testkit.Backend
	backend  backend.Backend // the agent's: be unless newHarnessOn says otherwise
	opts     vmagent.Options
	sealer   nkeys.KeyPair
	agentKey string // the agent's curve public key, from its HostOnline
	rec      *recorder
	stop     func()            // stops the running agent
	pools    map[string]string // attempt → the pool it was placed in (placeOn), for its teardown
}

func newHarness(t *testing.T, mutate func(*vmagent.Options)) *harness {
	t.Helper()
	return newHarnessOn(t, nil, mutate)
}

// newHarnessOn is newHarness with the agent on backend b (nil: the fake).
func newHarnessOn(t *testing.T, b backend.Backend, mutate func(*vmagent.Options)) *harness {
	t.Helper()
	_, js, _ := testkit.NATS(t)
	testkit.Stream(t, js, eventlog.StreamConfig{})
	sealer, err := nkeys.CreateCurveKeys()
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{host: "host-a", js: js, app: &eventlog.Appender{JS: js, Source: "berth/dispatcher/test"},
		be: testkit.NewBackend(t), backend: b, sealer: sealer, rec: &recorder{}, stop: func() {}, pools: map[string]string{}}
	if h.backend == nil {
		h.backend = h.be
	}
	h.opts = vmagent.Options{
		Host:          h.host,
		Pools:         map[string]events.PoolSlots{"linux": {Labels: []string{"self-hosted", "linux"}, Slots: 4}},
		PhysicalCap:   4,
		DataDir:       t.TempDir(),
		CreateTimeout: 300 * time.Millisecond,
		StopTimeout:   300 * time.Millisecond,
		Heartbeat:     50 * time.Millisecond,
		Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if testing.Verbose() {
		h.opts.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	if mutate != nil {
		mutate(&h.opts)
	}
	// List reports no VM unless a test says otherwise: the sweep tests set
	// the inventory they mean.
	h.be.SetInventory(nil, nil)
	h.follow(t)
	h.startAgent(t)
	return h
}

// follow records every fact of the log until cleanup.
func (h *harness) follow(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan eventlog.Delivered)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := eventlog.Follow(ctx, h.js, "test-follow", []string{events.SubjectAll}, 1, ch); err != nil && ctx.Err() == nil {
			t.Errorf("follow: %v", err)
		}
	}()
	go func() {
		defer wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case d := <-ch:
				if d.Err == nil {
					h.rec.mu.Lock()
					h.rec.evs = append(h.rec.evs, d.Event)
					h.rec.mu.Unlock()
				}
			}
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// startAgent runs an agent (again, after stop: same data dir, same curve
// key) and learns its curve key from the HostOnline it announces.
func (h *harness) startAgent(t *testing.T) {
	t.Helper()
	a, err := vmagent.New(h.js, &eventlog.Appender{JS: h.js, Source: "berth/vmagent/" + h.host}, h.backend, h.opts)
	if err != nil {
		t.Fatal(err)
	}
	// Count the announcements already seen before the agent can add its own.
	onlines := len(h.find(func(e events.Event) bool { _, ok := e.Data.(*events.HostOnline); return ok }))
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- a.Run(ctx) }()
	var once sync.Once
	h.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-errc:
				// Stopped while still starting (before its loop runs) it may
				// report the cancellation; anything else is a failure.
				if err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("agent Run: %v", err)
				}
			case <-time.After(waitLimit):
				t.Errorf("agent did not stop within %v of its context ending", waitLimit)
			}
		})
	}
	t.Cleanup(h.stop)
	all := h.waitN(t, "HostOnline", onlines+1, func(e events.Event) bool {
		on, ok := e.Data.(*events.HostOnline)
		return ok && on.Host == h.host
	})
	h.agentKey = all[len(all)-1].Data.(*events.HostOnline).CurveKey
}

func (h *harness) append(t *testing.T, p events.Payload) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if _, _, err := h.app.Append(ctx, h.app.New(time.Now(), p), nil); err != nil {
		t.Fatalf("append %s: %v", p.EventID(), err)
	}
}

// place books a slot and places an attempt on host with jit sealed to the
// agent's curve key, as the dispatcher does.
func (h *harness) place(t *testing.T, host, attempt string, jobID int64, jit []byte) {
	t.Helper()
	h.placeOn(t, host, "linux", attempt, jobID, jit)
}

// placeIn places attempt in pool on the harness's host, with the pool's
// labels.
func (h *harness) placeIn(t *testing.T, pool, attempt string, jobID int64, jit []byte) {
	t.Helper()
	h.placeOn(t, h.host, pool, attempt, jobID, jit)
}

func (h *harness) placeOn(t *testing.T, host, pool, attempt string, jobID int64, jit []byte) {
	t.Helper()
	sealed, err := sealing.Seal(h.sealer, h.agentKey, sealing.Placement{Attempt: attempt, Host: host, Pool: pool, JobID: jobID, BookedSeq: 1, JIT: jit})
	if err != nil {
		t.Fatal(err)
	}
	by, _ := h.sealer.PublicKey()
	labels := []string{"self-hosted", "linux"}
	if ps, ok := h.opts.Pools[pool]; ok && pool != "linux" {
		labels = ps.Labels
	}
	h.pools[attempt] = pool
	h.append(t, events.SlotReserved{Pool: pool, Host: host, Attempt: attempt, JobID: jobID, N: 1, Labels: labels})
	h.append(t, events.AttemptPlaced{AttemptRef: events.AttemptRef{Attempt: attempt, Pool: pool, Host: host},
		JobID: jobID, Labels: labels, RunnerID: jobID * 10, SealedJIT: sealed, SealedBy: by, SealedTo: h.agentKey})
}

// teardown releases the attempt's slot and requests its teardown, as the
// dispatcher does when the job completes (law 2: release first).
func (h *harness) teardown(t *testing.T, attempt string) {
	t.Helper()
	pool := h.pools[attempt]
	if pool == "" {
		pool = "linux"
	}
	h.append(t, events.SlotReleased{Pool: pool, Host: h.host, Attempt: attempt, Reason: events.ReleaseCompleted})
	h.append(t, events.AttemptTeardownRequested{AttemptRef: events.AttemptRef{Attempt: attempt, Pool: pool, Host: h.host},
		Reason: events.ReleaseCompleted})
}

func (h *harness) find(match func(events.Event) bool) []events.Event {
	var out []events.Event
	for _, e := range h.rec.snapshot() {
		if match(e) {
			out = append(out, e)
		}
	}
	return out
}

// waitN polls the log until n facts match, or fails after waitLimit.
func (h *harness) waitN(t *testing.T, what string, n int, match func(events.Event) bool) []events.Event {
	t.Helper()
	var got []events.Event
	testkit.EventuallyErr(t, waitLimit, fmt.Sprintf("%d× %s", n, what), func() error {
		if got = h.find(match); len(got) < n {
			return fmt.Errorf("log: %v", h.summary())
		}
		return nil
	})
	return got
}

// attemptFacts returns the facts of type typ about attempt (on this host).
func (h *harness) attemptFacts(attempt, typ string) []events.Event {
	return h.find(isFact(h.host, attempt, typ))
}

// wait waits for the first fact of type typ about attempt.
func (h *harness) wait(t *testing.T, attempt, typ string) events.Event {
	t.Helper()
	return h.waitN(t, typ+" of "+attempt, 1, isFact(h.host, attempt, typ))[0]
}

func isFact(host, attempt, typ string) func(events.Event) bool {
	return func(e events.Event) bool {
		return strings.HasPrefix(e.Subject, events.AttemptSubject(host, attempt)+".") && e.Type() == typ
	}
}

// waitCalls waits until the backend has seen n calls of step for attempt.
func (h *harness) waitCalls(t *testing.T, step, attempt string, n int) []testkit.Call {
	t.Helper()
	var got []testkit.Call
	testkit.Eventually(t, waitLimit, fmt.Sprintf("backend sees %d× %s of %s", n, step, attempt), func() bool {
		got = h.be.Calls(step, attempt)
		return len(got) >= n
	})
	return got
}

func (h *harness) summary() []string {
	var out []string
	for _, e := range h.rec.snapshot() {
		out = append(out, e.ID)
	}
	return out
}

// dirOf is the attempt's work dir under the agent's data dir.
func (h *harness) dirOf(attempt string) string {
	return filepath.Join(h.opts.DataDir, "attempts", attempt)
}
