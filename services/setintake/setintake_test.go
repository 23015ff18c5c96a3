package setintake

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/actions/scaleset"
	"go.uber.org/goleak"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/clock"
	"github.com/berth-ci/berth/services/dispatch"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testkit.LeakOptions()...) }

func base(id int64) scaleset.JobMessageBase {
	return scaleset.JobMessageBase{RunnerRequestID: id, OwnerName: "o", RepositoryName: "r", JobDisplayName: "build",
		WorkflowRunID: 7, RequestLabels: []string{"self-hosted", "linux"}}
}

// Given one message of every kind, then JobAssigned, JobStarted and
// JobCompleted become the webhook intake's facts under the job's own ids,
// JobAvailable only asks to acquire, and a JobStarted GitHub sent without
// a runner name (or a message without a request id) is skipped, not
// guessed at.
func TestFactsMirrorTheWebhookIntake(t *testing.T) {
	m := &scaleset.RunnerScaleSetMessage{
		JobAvailableMessages: []*scaleset.JobAvailable{{JobMessageBase: base(1)}, {JobMessageBase: base(0)}},
		JobAssignedMessages:  []*scaleset.JobAssigned{{JobMessageBase: base(2)}},
		JobStartedMessages:   []*scaleset.JobStarted{{JobMessageBase: base(2), RunnerName: "berth-2-1", RunnerID: 9}, {JobMessageBase: base(3)}},
		JobCompletedMessages: []*scaleset.JobCompleted{{JobMessageBase: base(2), Result: "failed", RunnerName: "berth-2-1"}},
	}
	facts, acquire, skipped := Facts(m, "")
	if len(acquire) != 1 || acquire[0] != 1 || skipped != 1 || len(facts) != 3 {
		t.Fatalf("acquire %v, skipped %d, %d facts; want [1], 1, 3", acquire, skipped, len(facts))
	}
	q, ok := facts[0].(events.JobQueued)
	if !ok || q.EventID() != "job-2-queued" || q.Org != "o" || q.Repo != "r" || q.RunID != 7 {
		t.Fatalf("JobAssigned became %#v; want JobQueued job-2-queued of o/r run 7", facts[0])
	}
	if s, ok := facts[1].(events.JobInProgress); !ok || s.RunnerName != "berth-2-1" || s.RunnerID != 9 {
		t.Fatalf("JobStarted became %#v", facts[1])
	}
	if c, ok := facts[2].(events.JobCompleted); !ok || c.Conclusion != "failure" {
		t.Fatalf("JobCompleted became %#v; want conclusion failure", facts[2])
	}
	// A set of another installation names it in every fact: only that
	// installation's pools serve the job.
	named, _, _ := Facts(m, "acme")
	for _, p := range named {
		var inst string
		switch f := p.(type) {
		case events.JobQueued:
			inst = f.Installation
		case events.JobInProgress:
			inst = f.Installation
		case events.JobCompleted:
			inst = f.Installation
		}
		if inst != "acme" {
			t.Errorf("%s of installation acme's set names installation %q", p.EventType(), inst)
		}
	}
}

func fold(t *testing.T, ps ...events.Payload) *events.Fleet {
	t.Helper()
	f := events.NewFleet()
	for i, p := range ps {
		role := events.Role("")
		if _, ok := p.(*events.HostCordoned); ok {
			role = events.RoleCLI
		}
		ev := events.NewBy("test", role, time.Unix(int64(1000+i), 0), p)
		ev.Seq = uint64(i + 1)
		testkit.ApplyGranted(f, ev) // a host is offered what the admin granted
	}
	return f
}

func host(name string, slots int) *events.HostOnline {
	return &events.HostOnline{Host: name, Boot: "b", PhysicalCap: 10, CurveKey: "k", At: time.Unix(1000, 0),
		Pools: map[string]events.PoolSlots{"linux": {Labels: []string{"self-hosted", "linux"}, Slots: slots}}}
}

// Given two hosts with 4 and 3 linux slots and one linux job waiting for
// a slot, then the capacity is 7: the job, and 6 more places; when host-b
// is cordoned, 4: its slots no longer count.
func TestCapacityCountsFreeSlotsOnAcceptingHostsAndOpenJobs(t *testing.T) {
	job := &events.JobQueued{JobRef: events.JobRef{JobID: 5, Labels: []string{"self-hosted", "linux"}}}
	if got := Capacity(fold(t, host("host-a", 4), host("host-b", 3), job), "linux"); got != 7 {
		t.Fatalf("capacity %d, want 7", got)
	}
	cordon := &events.HostCordoned{HostChange: events.HostChange{Host: "host-b", By: "ops"}}
	if got := Capacity(fold(t, host("host-a", 4), host("host-b", 3), job, cordon), "linux"); got != 4 {
		t.Fatalf("capacity with host-b cordoned %d, want 4", got)
	}
	if got := Capacity(fold(t, host("host-a", 4)), "macos"); got != 0 {
		t.Fatalf("capacity of a pool no host offers %d, want 0", got)
	}
}

func TestGapIsAssignedJobsTheFoldDoesNotHold(t *testing.T) {
	for _, c := range []struct{ assigned, open, want int }{{5, 3, 2}, {3, 5, 0}, {4, 4, 0}} {
		if got := Gap(&scaleset.RunnerScaleSetStatistic{TotalAssignedJobs: c.assigned}, c.open); got != c.want {
			t.Errorf("Gap(%d assigned, %d open) = %d, want %d", c.assigned, c.open, got, c.want)
		}
	}
	if Gap(nil, 0) != 0 {
		t.Error("no statistics yet must be no gap")
	}
}

// searches counts the REST reads a reconciler makes.
type searches struct{ n int }

func (s *searches) QueuedJobsIn(context.Context, string, string, int, func(int64) bool) ([]dispatch.QueuedJob, []int64, error) {
	s.n++
	return nil, nil, nil
}
func (s *searches) Spare() bool { return true }

// reconcilerOn is the linux set's reconciler reading *f (swap the fold
// through f), a REST stand-in counting its searches, and its fake clock.
func reconcilerOn(f **events.Fleet) (*reconciler, *searches, *clock.Fake) {
	rest := &searches{}
	clk := clock.NewFake(time.Unix(2000, 0))
	in := &Intake{Lister: rest, Clock: clk, ReconcileEvery: time.Second,
		Read: func(_ context.Context, fn func(*events.Fleet)) error { fn(*f); return nil }}
	r := newReconciler(in, &scaleset.RunnerScaleSet{Name: "linux"}, slog.New(slog.DiscardHandler))
	r.repos[[2]string{"example-org", "example-repo"}] = true
	return r, rest, clk
}

// Given statistics that count 3 assigned jobs the fold does not hold, when
// the fold has not reached the facts the intake itself stored (their
// JobQueued), then no round counts and the REST API is not searched: it
// lists the jobs acquired and not yet assigned as queued too, and storing
// one would let GitHub assign a job beyond the slots. Once the fold has
// reached them, a gap seen in two rounds is searched.
func TestAGapOnAFoldBehindTheIntakesOwnFactsIsNotSearched(t *testing.T) {
	f := fold(t, host("host-a", 4)) // LastSeq 1
	r, rest, clk := reconcilerOn(&f)
	r.stored = 5 // the intake stored facts up to seq 5; the fold is at 1
	stats := &scaleset.RunnerScaleSetStatistic{TotalAssignedJobs: 3}
	for range 4 {
		clk.Advance(2 * time.Second)
		r.round(context.Background(), stats)
	}
	if rest.n != 0 {
		t.Fatalf("the REST API was searched %d times on a fold behind the intake's own facts; want none", rest.n)
	}
	f.LastSeq = 5
	for range 2 {
		clk.Advance(2 * time.Second)
		r.round(context.Background(), stats)
	}
	if rest.n == 0 {
		t.Fatal("a gap seen twice on a fold that reached the intake's facts was not searched")
	}
}

// Given statistics that count 2 assigned jobs, sent when the fold held
// both, when both complete in the fold and polls come back with no
// message (the capacity rose), then no round counts a gap: the statistics
// are GitHub's count when their message was sent, and the REST API lists
// acquired jobs as queued, so a fill then stored one GitHub never
// assigned and the capacity let it assign a ninth job to eight slots
// (TestScaleSetCapacityBoundsAssignment, under make test's load). A gap
// the fold already had when the statistics came is still searched.
func TestStatisticsOlderThanTheFoldsCompletionsAreNoGap(t *testing.T) {
	queued := func(id int64) *events.JobQueued {
		return &events.JobQueued{JobRef: events.JobRef{JobID: id, Labels: []string{"self-hosted", "linux"}}}
	}
	f := fold(t, host("host-a", 4), queued(1), queued(2))
	r, rest, clk := reconcilerOn(&f)
	r.round(context.Background(), &scaleset.RunnerScaleSetStatistic{TotalAssignedJobs: 2})
	for i, id := range []int64{1, 2} {
		ev := events.New("test", time.Unix(int64(1100+i), 0), &events.JobCompleted{JobRef: queued(id).JobRef, Conclusion: "success"})
		ev.Seq = f.LastSeq + 1
		testkit.ApplyGranted(f, ev)
	}
	if open := OpenJobs(f, "linux"); open != 0 {
		t.Fatalf("the fold holds %d open jobs after both completed, want 0", open)
	}
	for range 4 {
		clk.Advance(2 * time.Second)
		r.round(context.Background(), nil)
	}
	if rest.n != 0 {
		t.Fatalf("the REST API was searched %d times for jobs that completed after the statistics were sent; want none", rest.n)
	}
	f = fold(t, host("host-a", 4), queued(3))
	r.round(context.Background(), &scaleset.RunnerScaleSetStatistic{TotalAssignedJobs: 2})
	for range 3 {
		clk.Advance(2 * time.Second)
		r.round(context.Background(), nil)
	}
	if rest.n == 0 {
		t.Fatal("a gap the fold had when the statistics came (2 assigned, 1 known) was not searched on polls with no message")
	}
}

// Given replica A holding a set's lease and B watching it, when A renews,
// then B (on its own clock) waits a full TTL from the last change it saw;
// when A stops renewing, B takes the lease after the TTL, keeping the
// stored cursor, and A's next write is refused (ErrLeaseLost).
func TestLeaseIsTakenOverOnlyAfterItStandsStillForItsTTL(t *testing.T) {
	ctx := context.Background()
	_, js, _ := testkit.NATS(t)
	kv, err := eventlog.OpenBucket(ctx, js, events.BucketScaleSets, 1)
	if err != nil {
		t.Fatal(err)
	}
	ca, cb := clock.NewFake(time.Unix(0, 0)), clock.NewFake(time.Unix(5000, 0)) // clocks that disagree
	a := &lease{kv: kv, key: "linux", owner: "a", ttl: 6 * time.Second, clk: ca}
	b := &lease{kv: kv, key: "linux", owner: "b", ttl: 6 * time.Second, clk: cb}
	try := func(l *lease) bool {
		t.Helper()
		ok, err := l.tryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !try(a) || try(b) {
		t.Fatal("a must take the free lease and b must not")
	}
	if err := a.write(ctx, func(r *Record) { r.LastMessageID, r.SessionID = 42, "s1" }); err != nil {
		t.Fatal(err)
	}
	if try(b) {
		t.Fatal("b took the lease it just saw move")
	}
	cb.Advance(5 * time.Second)
	if err := a.renew(ctx); err != nil {
		t.Fatal(err)
	}
	cb.Advance(5 * time.Second)
	if try(b) {
		t.Fatal("b took a lease a renewed 5 s ago on b's clock (TTL 6 s)")
	}
	cb.Advance(5 * time.Second)
	if try(b) {
		t.Fatal("b took the lease 5 s after it last saw it move (TTL 6 s)")
	}
	cb.Advance(time.Second)
	if !try(b) {
		t.Fatal("b did not take a lease that stood still for its TTL")
	}
	if r := b.record(); r.LastMessageID != 42 || r.SessionID != "s1" || r.Owner != "b" {
		t.Fatalf("b's record %+v: want a's cursor and session kept", r)
	}
	if err := a.renew(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("a's renewal after the takeover: %v, want ErrLeaseLost", err)
	}
}

// Given a pool configured for a scale set whose set is not created yet
// (and whose labels the intake has not read yet), when a runner is minted
// for it, then the mint waits (ErrSetNotReady, which is retried) and never
// goes to the REST API: a REST runner is never given a scale set's job, so
// its slot would be held for nothing.
func TestAScaleSetPoolsRunnerIsNeverMintedThroughTheRESTAPI(t *testing.T) {
	m := &Minter{Sets: &Sets{}, Pools: []string{"linux"}, SetWait: 10 * time.Millisecond} // no REST minter: reaching it panics
	_, _, err := m.Mint(t.Context(), dispatch.MintRequest{RunnerName: "berth-1-1", Pool: "linux", Labels: []string{"self-hosted", "linux"}})
	if !errors.Is(err, ErrSetNotReady) || !dispatch.MintRetryable(err) {
		t.Fatalf("mint before the set exists: %v; want ErrSetNotReady, retried", err)
	}
}

// Given a linux job in progress on a runner of ours (booked, placed,
// started), then it is open, as GitHub counts it assigned, and the
// capacity is that job plus the 3 free slots: a pool whose running jobs
// went uncounted advertised only its free slots, so GitHub kept half the
// fleet idle.
func TestAJobInProgressOnOurRunnerCountsAsOpen(t *testing.T) {
	labels := []string{"self-hosted", "linux"}
	job := &events.JobQueued{JobRef: events.JobRef{JobID: 5, Labels: labels}}
	ref := events.AttemptRef{Attempt: "berth-5-1", Pool: "linux", Host: "host-a"}
	f := fold(t, host("host-a", 4), job,
		&events.SlotReserved{Pool: "linux", Host: "host-a", Attempt: ref.Attempt, JobID: 5, N: 1, Labels: labels},
		&events.AttemptPlaced{AttemptRef: ref, JobID: 5},
		&events.JobInProgress{JobRef: events.JobRef{JobID: 5, Labels: labels}, RunnerName: ref.Attempt})
	if got := OpenJobs(f, "linux"); got != 1 {
		t.Fatalf("open jobs %d, want 1 (the one in progress)", got)
	}
	if got := Capacity(f, "linux"); got != 4 {
		t.Fatalf("capacity %d, want 4: the running job and 3 free slots", got)
	}
}
