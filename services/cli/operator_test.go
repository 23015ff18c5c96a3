package cli_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/cli"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testkit.LeakOptions()...) }

// Given a host in the log, when an operator cordons, uncordons and drains it
// with the CLI, then each is a fact on the host's subject that the fold
// shows, signed by the operator; an unknown host is refused with the list
// of known ones.
func TestOperatorHostActionsAreFacts(t *testing.T) {
	ctx, js := newLog(t)
	app := &eventlog.Appender{JS: js, Source: "test"}
	if _, _, err := app.Append(ctx, app.New(time.Now(), events.HostOnline{Host: "mac-1", Boot: "b", PhysicalCap: 2}), nil); err != nil {
		t.Fatal(err)
	}
	host := func() *events.Host {
		f, err := eventlog.Replay(ctx, js, nil)
		if err != nil {
			t.Fatal(err)
		}
		return f.Hosts["mac-1"]
	}
	if _, err := cli.HostAction(ctx, js, "cordon", "mac-1", "disk swap"); err != nil {
		t.Fatal(err)
	}
	if h := host(); !h.Cordoned || h.CordonReason != "disk swap" || !strings.HasPrefix(h.CordonBy, "operator") {
		t.Fatalf("after cordon: %+v", h)
	}
	if _, err := cli.HostAction(ctx, js, "uncordon", "mac-1", ""); err != nil {
		t.Fatal(err)
	}
	if h := host(); h.Cordoned {
		t.Fatal("still cordoned after uncordon")
	}
	if _, err := cli.HostAction(ctx, js, "drain", "mac-1", "retire"); err != nil {
		t.Fatal(err)
	}
	if h := host(); h.State != events.HostStateDraining {
		t.Fatalf("state %s after drain", h.State)
	}
	// The way back from `berth drain`: an operator's uncordon.
	if _, err := cli.HostAction(ctx, js, "uncordon", "mac-1", ""); err != nil {
		t.Fatal(err)
	}
	if h := host(); h.State != events.HostStateOnline || !h.Accepts() {
		t.Fatalf("state %s (accepts %v) after uncordon of an operator's drain, want online", h.State, h.Accepts())
	}
	var same cli.Unchanged
	if _, err := cli.HostAction(ctx, js, "uncordon", "mac-1", ""); !errors.As(err, &same) || !strings.Contains(err.Error(), "nothing stored") {
		t.Fatalf("uncordon of an online host: %v; want Unchanged saying nothing is stored", err)
	}
	if _, err := cli.HostAction(ctx, js, "cordon", "mac-1", "a"); err != nil {
		t.Fatal(err)
	}
	before := lastSeq(t, js)
	if _, err := cli.HostAction(ctx, js, "cordon", "mac-1", "a"); !errors.As(err, &same) || !strings.Contains(err.Error(), "already cordoned") {
		t.Fatalf("second cordon: %v; want Unchanged", err)
	}
	if after := lastSeq(t, js); after != before {
		t.Fatalf("a no-op cordon stored a fact: last seq %d -> %d", before, after)
	}
	if _, err := cli.HostAction(ctx, js, "cordon", "nope", ""); err == nil || !strings.Contains(err.Error(), "mac-1") {
		t.Fatalf("unknown host: %v", err)
	}
}

func lastSeq(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().State.LastSeq
}

// Given an attempt that holds a slot though its VM stopped (what a slot-leak
// alarm reports), when the operator releases it by hand, then its slot is
// released (reason operator) and the fold's invariants hold again; a second
// release changes nothing.
func TestOperatorReleaseOfALeakedSlot(t *testing.T) {
	ctx, js, app, ref := provisioningAttempt(t)
	appendAll(ctx, t, app, events.AttemptStopped{AttemptRef: ref})
	if _, err := cli.ReleaseAttempt(ctx, js, ref.Attempt, false); err != nil {
		t.Fatal(err)
	}
	f, err := eventlog.Replay(ctx, js, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a := f.Attempts[ref.Attempt]; a.Held() || a.ReleaseReason != events.ReleaseOperator {
		t.Fatalf("after release: held %v reason %q", a.Held(), a.ReleaseReason)
	}
	if vs := f.Check(); len(vs) != 0 {
		t.Fatalf("invariants: %v", vs)
	}
	what, err := cli.ReleaseAttempt(ctx, js, ref.Attempt, false)
	if err != nil || !strings.Contains(what, "nothing to do") {
		t.Fatalf("second release: %q %v", what, err)
	}
	if _, err := cli.ReleaseAttempt(ctx, js, "berth-404-1", false); err == nil {
		t.Fatal("released an unknown attempt")
	}
}

// Found attacking the landed code (issue 16): JetStream deduplicates
// Nats-Msg-Id across the whole stream and any credential may send any id.
// Given another writer that first stored something else, on a subject of
// its own, under the ids an operator's release and teardown will use, when
// the operator releases the attempt, then both facts are stored (under
// fresh ids) and the fold shows the slot released and the teardown asked;
// before, the server's "duplicate" answer was taken as stored, and the cli
// said "released" for nothing.
func TestAnOperatorsReleaseIsStoredThoughAnotherWriterTookItsIds(t *testing.T) {
	ctx, js, app, ref := provisioningAttempt(t)
	cliApp := &eventlog.Appender{Role: events.RoleCLI}
	for _, p := range []events.Payload{
		events.SlotReleased{Pool: "linux", Host: "h", Attempt: ref.Attempt, Reason: events.ReleaseOperator, JobID: 9},
		events.AttemptTeardownRequested{AttemptRef: ref, Reason: events.ReleaseOperator},
	} {
		decoy := app.New(time.Now(), events.AttemptReady{AttemptRef: ref}) // the agent's subject, another fact
		body, err := events.Marshal(decoy)
		if err != nil {
			t.Fatal(err)
		}
		id := eventlog.MsgID(cliApp.New(time.Now(), p))
		if _, err := js.Publish(ctx, decoy.Subject, body, jetstream.WithMsgID(id)); err != nil {
			t.Fatal(err)
		}
	}
	what, err := cli.ReleaseAttempt(ctx, js, ref.Attempt, false)
	f, rerr := eventlog.Replay(ctx, js, nil)
	if rerr != nil {
		t.Fatal(rerr)
	}
	a := f.Attempts[ref.Attempt]
	if err == nil && (a.Held() || !a.TeardownReq) {
		t.Fatalf("the cli said %q, but the log holds: slot held %v, teardown asked %v", what, a.Held(), a.TeardownReq)
	}
	if err != nil || a.ReleaseReason != events.ReleaseOperator {
		t.Fatalf("release: %q %v; release reason %q, want the operator's stored", what, err, a.ReleaseReason)
	}
	if want := "slot of pool " + ref.Pool + " released; teardown requested on " + ref.Host; what != want {
		t.Fatalf("the cli said %q, want %q", what, want)
	}
}

// newLog starts an embedded server with the stream, for one test.
func newLog(t *testing.T) (context.Context, jetstream.JetStream) {
	t.Helper()
	_, js, _ := testkit.NATS(t)
	testkit.Stream(t, js, eventlog.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx, js
}

func TestEventsFiltersNamingTwoAggregatesAreRefused(t *testing.T) {
	for _, f := range []cli.Filter{{Job: 1, Pool: "linux"}, {Pool: "linux", Host: "h"}, {Job: 1, Attempt: "berth-1-1"}} {
		if err := f.Validate(); err == nil {
			t.Errorf("%+v accepted, want refused", f)
		}
	}
	for _, f := range []cli.Filter{{}, {Job: 1}, {Attempt: "berth-1-1", Host: "h"}, {Host: "h"}} {
		if err := f.Validate(); err != nil {
			t.Errorf("%+v refused: %v", f, err)
		}
	}
}

// Given a log with no fact of job 8, when an operator follows its events,
// then berth says on the note stream that it waits for the first (not a
// silent terminal), and prints job 8's fact once one is stored.
func TestFollowingAnAggregateTheLogLacksSaysItWaits(t *testing.T) {
	ctx, js := newLog(t)
	fctx, stop := context.WithCancel(ctx)
	var out, note syncBuffer
	done := make(chan error, 1)
	go func() { done <- cli.Tail(fctx, js, cli.Filter{Job: 8}, true, false, &out, &note) }()
	testkit.Eventually(t, 5*time.Second, "a note that it waits", func() bool {
		return strings.Contains(note.String(), "waiting for its first fact") && strings.Contains(note.String(), "job 8")
	})
	app := &eventlog.Appender{JS: js, Source: "test", Role: events.RoleDispatcher}
	if _, _, err := app.Append(ctx, app.New(time.Now(), &events.JobQueued{JobRef: testkit.JobRef(8)}), nil); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, "job 8's fact printed", func() bool { return strings.Contains(out.String(), "job.queued") })
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Tail after Ctrl-C: %v", err)
	}
	if strings.Count(note.String(), "waiting") != 1 {
		t.Errorf("note printed %q; want the waiting note once", note.String())
	}
}

// provisioningAttempt lays down host h (pool linux, 2 slots) and attempt
// berth-9-1 booked, placed and provisioning there for job 9.
func provisioningAttempt(t *testing.T) (context.Context, jetstream.JetStream, *eventlog.Appender, events.AttemptRef) {
	t.Helper()
	ctx, js := newLog(t)
	app := &eventlog.Appender{JS: js, Source: "test"}
	ref := events.AttemptRef{Attempt: "berth-9-1", Pool: "linux", Host: "h"}
	appendAll(ctx, t, app,
		events.HostOnline{Host: "h", Boot: "b", PhysicalCap: 2, Pools: map[string]events.PoolSlots{"linux": {Labels: []string{"linux"}, Slots: 2}}},
		events.SlotReserved{Pool: "linux", Host: "h", Attempt: ref.Attempt, JobID: 9, N: 1},
		events.AttemptPlaced{AttemptRef: ref, JobID: 9}, events.AttemptProvisioning{AttemptRef: ref})
	return ctx, js, app, ref
}

func appendAll(ctx context.Context, t *testing.T, app *eventlog.Appender, ps ...events.Payload) {
	t.Helper()
	for _, p := range ps {
		if _, _, err := app.Append(ctx, app.New(time.Now(), p), nil); err != nil {
			t.Fatal(err)
		}
	}
}

// Given a log of three jobs, when they are listed with a limit of two,
// then the newest two are listed and a line below says how many the list
// left out and how to list them all; with no limit, no such line.
func TestAJobListCutShortSaysSo(t *testing.T) {
	f := events.NewFleet()
	t0 := time.Date(2026, 12, 7, 4, 0, 0, 0, time.UTC)
	for i := range 3 {
		e := events.New("test", t0.Add(time.Duration(i)*time.Minute), &events.JobQueued{JobRef: events.JobRef{JobID: int64(i + 1), Labels: []string{"linux"}}})
		e.Seq = uint64(i + 1)
		f.Apply(e)
	}
	var cut, whole strings.Builder
	if err := cli.PrintJobs(&cut, f, 2); err != nil {
		t.Fatal(err)
	}
	if err := cli.PrintJobs(&whole, f, 0); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(cut.String(), "(the newest 2 of 3 jobs; --limit 0 lists them all)") || strings.Contains(cut.String(), "\n1 ") {
		t.Fatalf("listed with --limit 2:\n%s\nwant jobs 3 and 2 and a line saying 2 of 3", cut.String())
	}
	if strings.Contains(whole.String(), "newest") || !strings.Contains(whole.String(), "\n1 ") {
		t.Fatalf("listed with no limit:\n%s\nwant every job and no note", whole.String())
	}
}
