package ghsim_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/tests/ghsim"
)

type acquireResult struct {
	code int
	resp ghsim.AcquireResponse
	err  error
}

// acquireAsync runs one acquire long-poll in a goroutine (no t.Fatal there).
func acquireAsync(t *testing.T, ctx context.Context, sim *ghsim.Sim, encoded string) <-chan acquireResult {
	cfg, err := ghsim.DecodeJITConfig(encoded)
	if err != nil {
		t.Fatal(err)
	}
	client := httpClient(t)
	ch := make(chan acquireResult, 1)
	go func() {
		var res acquireResult
		res.code, res.err = postWith(ctx, client, sim.URL()+ghsim.AcquirePath, ghsim.AcquireRequest{Token: cfg.Token}, &res.resp)
		ch <- res
	}()
	return ch
}

func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitLimit):
		t.Fatalf("timed out after %v", waitLimit)
		panic("unreachable")
	}
}

func TestJobLifecycleWebhooksInOrder(t *testing.T) {
	sim, rc := newSim(t)
	jobID := sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted", "linux"}, Duration: 50 * time.Millisecond})
	runnerID, enc := mint(t, sim, "berth-runner-1", "self-hosted", "linux", "x64")

	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := ghsim.RunRunner(ctx, enc, nil); err != nil {
		t.Fatalf("RunRunner: %v", err)
	}
	j := job(t, sim, jobID)
	if j.Status != ghsim.StatusCompleted || j.Conclusion != ghsim.ConclusionSuccess || j.RunnerName != "berth-runner-1" ||
		j.RunnerID != runnerID || j.Completions != 1 || j.StartedAt.IsZero() || j.CompletedAt.Before(j.StartedAt) {
		t.Fatalf("job after run: %+v", j)
	}
	if rs := sim.Runners(); len(rs) != 0 {
		t.Fatalf("ephemeral runner not removed: %+v", rs)
	}
	testkit.Eventually(t, waitLimit, "3 webhooks", func() bool { return len(rc.all()) == 3 })
	evs := jobEvents(t, rc, jobID)
	wantActions := []string{"queued", "in_progress", "completed"}
	for i, ev := range evs {
		wj := ev.GetWorkflowJob()
		if ev.GetAction() != wantActions[i] || wj.GetStatus() != wantActions[i] {
			t.Fatalf("event %d: action %q status %q, want %q", i, ev.GetAction(), wj.GetStatus(), wantActions[i])
		}
		if i == 0 && (wj.RunnerName != nil || wj.RunnerID != nil) {
			t.Fatalf("queued event has runner fields: %v %v", wj.RunnerName, wj.RunnerID)
		}
		if i > 0 && (wj.GetRunnerName() != "berth-runner-1" || wj.GetRunnerID() != runnerID || wj.GetRunnerGroupName() != "Default") {
			t.Fatalf("%s event runner = %q/%d/%q", ev.GetAction(), wj.GetRunnerName(), wj.GetRunnerID(), wj.GetRunnerGroupName())
		}
		if wj.GetRunID() != j.RunID || wj.GetRunAttempt() != 1 || len(wj.Labels) != 2 || wj.Labels[1] != "linux" {
			t.Fatalf("%s event job fields: %+v", ev.GetAction(), wj)
		}
		if ev.GetRepo().GetFullName() != testOrg+"/"+testRepo || ev.GetOrg().GetLogin() != testOrg {
			t.Fatalf("envelope: repo %q org %q", ev.GetRepo().GetFullName(), ev.GetOrg().GetLogin())
		}
	}
	if len(evs) != 3 || evs[2].GetWorkflowJob().GetConclusion() != "success" {
		t.Fatalf("want 3 events ending in success, got %d", len(evs))
	}

	// The ephemeral runner got its one job: another acquire is refused; complete is idempotent.
	if code, _ := acquire(t, ctx, sim, enc); code != http.StatusGone {
		t.Fatalf("second acquire = %d, want 410", code)
	}
	if code := complete(t, sim, enc, jobID); code != http.StatusOK {
		t.Fatalf("repeated complete = %d, want 200", code)
	}
	if j := job(t, sim, jobID); j.Completions != 1 {
		t.Fatalf("completions after repeated complete = %d", j.Completions)
	}
	if calls := sim.APICalls(); calls[ghsim.RouteRunnerAcquire] != 2 || calls[ghsim.RouteJITConfigOrg] != 1 {
		t.Fatalf("APICalls = %v", calls)
	}
}

func TestFailureConclusion(t *testing.T) {
	sim, rc := newSim(t)
	jobID := sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted"}, Conclusion: "failure"})
	_, enc := mint(t, sim, "r-fail", "self-hosted")
	if err := ghsim.RunRunner(context.Background(), enc, nil); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, waitLimit, "completed webhook", func() bool { return len(jobEvents(t, rc, jobID)) == 3 })
	if c := jobEvents(t, rc, jobID)[2].GetWorkflowJob().GetConclusion(); c != "failure" {
		t.Fatalf("conclusion = %q", c)
	}
}

func TestRunnerIsHandedAnyMatchingJob(t *testing.T) {
	sim, _ := newSim(t)
	ctx := context.Background()
	labels := []string{"self-hosted", "linux"}
	jobA := sim.Enqueue(ghsim.JobSpec{Labels: labels})
	_, encForA := mint(t, sim, "runner-for-a", labels...)
	_, encOther := mint(t, sim, "runner-other", labels...)

	// Another runner takes A first.
	if code, got := acquire(t, ctx, sim, encOther); code != http.StatusOK || got.JobID != jobA {
		t.Fatalf("other runner: %d %+v, want job A %d", code, got, jobA)
	}
	// The runner minted for A is handed B, the only queued job it matches.
	ch := acquireAsync(t, ctx, sim, encForA)
	jobB := sim.Enqueue(ghsim.JobSpec{Labels: labels})
	res := recv(t, ch)
	if res.err != nil || res.code != http.StatusOK || res.resp.JobID != jobB {
		t.Fatalf("runner-for-a: %+v, want job B %d", res, jobB)
	}
	if a, b := job(t, sim, jobA), job(t, sim, jobB); a.RunnerName != "runner-other" || b.RunnerName != "runner-for-a" ||
		b.Status != ghsim.StatusInProgress {
		t.Fatalf("A=%+v B=%+v", a, b)
	}
}

func TestLabelsMustBeSubsetAndFIFO(t *testing.T) {
	sim, _ := newSim(t, func(c *ghsim.Config) { c.AcquireTimeout = 150 * time.Millisecond })
	ctx := context.Background()
	gpu := sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted", "gpu"}})
	first := sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted"}})
	second := sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted"}})

	_, encLinux := mint(t, sim, "linux-only", "self-hosted", "linux")
	_, encLinux2 := mint(t, sim, "linux-only-2", "self-hosted", "linux")
	_, encLinux3 := mint(t, sim, "linux-only-3", "self-hosted", "linux")
	_, encGPU := mint(t, sim, "gpu", "SELF-HOSTED", "Linux", "GPU")

	if code, got := acquire(t, ctx, sim, encLinux); code != http.StatusOK || got.JobID != first {
		t.Fatalf("linux runner got %d %+v, want oldest matching job %d", code, got, first)
	}
	if code, got := acquire(t, ctx, sim, encLinux2); code != http.StatusOK || got.JobID != second {
		t.Fatalf("linux runner 2 got %d %+v, want %d", code, got, second)
	}
	// Only the gpu job is left: a runner without "gpu" long-polls and gets 204.
	if code, got := acquire(t, ctx, sim, encLinux3); code != http.StatusNoContent {
		t.Fatalf("non-matching runner got %d %+v, want 204", code, got)
	}
	if j := job(t, sim, gpu); j.Status != ghsim.StatusQueued {
		t.Fatalf("gpu job = %+v", j)
	}
	// Label matching ignores case.
	if code, got := acquire(t, ctx, sim, encGPU); code != http.StatusOK || got.JobID != gpu {
		t.Fatalf("gpu runner got %d %+v, want %d", code, got, gpu)
	}
}

func TestCancelQueuedJob(t *testing.T) {
	sim, rc := newSim(t, func(c *ghsim.Config) { c.AcquireTimeout = 100 * time.Millisecond })
	jobID := sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted", "arm64"}})
	if !sim.Cancel(jobID) {
		t.Fatal("Cancel(queued) = false")
	}
	if sim.Cancel(jobID) || sim.Cancel(12345) {
		t.Fatal("Cancel of a finished or unknown job = true")
	}
	j := job(t, sim, jobID)
	if j.Status != ghsim.StatusCompleted || j.Conclusion != ghsim.ConclusionCancelled || j.Completions != 1 || j.RunnerName != "" {
		t.Fatalf("cancelled job = %+v", j)
	}
	_, enc := mint(t, sim, "arm", "self-hosted", "arm64")
	if code, _ := acquire(t, context.Background(), sim, enc); code != http.StatusNoContent {
		t.Fatalf("acquire after cancel = %d, want 204", code)
	}
	testkit.Eventually(t, waitLimit, "2 webhooks", func() bool { return len(jobEvents(t, rc, jobID)) == 2 })
	ev := jobEvents(t, rc, jobID)[1]
	wj := ev.GetWorkflowJob()
	if ev.GetAction() != "completed" || wj.GetConclusion() != "cancelled" || wj.RunnerName == nil || wj.GetRunnerName() != "" ||
		wj.RunnerID == nil || wj.GetRunnerID() != 0 || len(wj.Steps) != 0 {
		t.Fatalf("cancel webhook: action %q %+v", ev.GetAction(), wj)
	}

	// An assigned job cannot be cancelled through Cancel.
	busy := sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted"}})
	_, enc2 := mint(t, sim, "r2", "self-hosted")
	if code, _ := acquire(t, context.Background(), sim, enc2); code != http.StatusOK {
		t.Fatalf("acquire = %d", code)
	}
	if sim.Cancel(busy) {
		t.Fatal("Cancel(in_progress) = true")
	}
}

func TestCancelledAcquireAssignsNothing(t *testing.T) {
	sim, _ := newSim(t)
	labels := []string{"self-hosted"}
	_, enc := mint(t, sim, "killed", labels...)
	ctx, cancel := context.WithCancel(context.Background())
	ch := acquireAsync(t, ctx, sim, enc)
	testkit.Eventually(t, waitLimit, "runner online", func() bool { rs := sim.Runners(); return len(rs) == 1 && rs[0].Status == "online" })
	cancel()
	if res := recv(t, ch); res.err == nil {
		t.Fatalf("cancelled acquire returned %+v", res)
	}
	testkit.Eventually(t, waitLimit, "runner offline", func() bool { return sim.Runners()[0].Status == "offline" })

	jobID := sim.Enqueue(ghsim.JobSpec{Labels: labels})
	_, enc2 := mint(t, sim, "alive", labels...)
	if code, got := acquire(t, context.Background(), sim, enc2); code != http.StatusOK || got.JobID != jobID {
		t.Fatalf("live runner got %d %+v", code, got)
	}
	if rs := sim.Runners(); rs[0].Name != "killed" || rs[0].Busy || rs[0].JobID != 0 {
		t.Fatalf("killed runner was assigned: %+v", rs[0])
	}
}

func TestRunRunnerContextCancel(t *testing.T) {
	sim, _ := newSim(t)
	_, enc := mint(t, sim, "waiting", "self-hosted")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ghsim.RunRunner(ctx, enc, nil) }()
	testkit.Eventually(t, waitLimit, "runner online", func() bool { return sim.Runners()[0].Status == "online" })
	cancel()
	if err := recv(t, done); !errors.Is(err, context.Canceled) {
		t.Fatalf("RunRunner = %v, want context.Canceled", err)
	}

	// Killed mid-job: the job stays in progress, nothing is completed.
	jobID := sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted"}, Duration: time.Hour})
	_, enc2 := mint(t, sim, "mid-job", "self-hosted")
	ctx2, cancel2 := context.WithCancel(context.Background())
	go func() { done <- ghsim.RunRunner(ctx2, enc2, nil) }()
	testkit.Eventually(t, waitLimit, "job in progress", func() bool { return job(t, sim, jobID).Status == ghsim.StatusInProgress })
	cancel2()
	if err := recv(t, done); !errors.Is(err, context.Canceled) {
		t.Fatalf("RunRunner = %v, want context.Canceled", err)
	}
	if j := job(t, sim, jobID); j.Status != ghsim.StatusInProgress || j.Completions != 0 {
		t.Fatalf("job after killed runner = %+v", j)
	}
}

func TestRejectedRunners(t *testing.T) {
	sim, _ := newSim(t)
	ctx := context.Background()
	gh := ghClient(t, sim, "t")

	// Deleted before acquiring.
	id, enc := mint(t, sim, "deleted", "self-hosted")
	if _, err := gh.Actions.RemoveOrganizationRunner(ctx, testOrg, id); err != nil {
		t.Fatal(err)
	}
	if code, _ := acquire(t, ctx, sim, enc); code != http.StatusGone {
		t.Fatalf("acquire after delete = %d, want 410", code)
	}
	if err := ghsim.RunRunner(ctx, enc, nil); !errors.Is(err, ghsim.ErrRunnerRejected) {
		t.Fatalf("RunRunner(deleted) = %v", err)
	}

	// Deleted while polling: the poll ends with 410.
	id2, enc2 := mint(t, sim, "deleted-while-polling", "self-hosted")
	ch := acquireAsync(t, ctx, sim, enc2)
	testkit.Eventually(t, waitLimit, "runner online", func() bool { rs := sim.Runners(); return len(rs) == 1 && rs[0].Status == "online" })
	if _, err := gh.Actions.RemoveOrganizationRunner(ctx, testOrg, id2); err != nil {
		t.Fatal(err)
	}
	if res := recv(t, ch); res.code != http.StatusGone {
		t.Fatalf("polling acquire after delete = %+v", res)
	}

	// Unknown token.
	if code, err := simPost(t, ctx, sim, ghsim.AcquirePath, ghsim.AcquireRequest{Token: "nope"}, nil); err != nil || code != http.StatusUnauthorized {
		t.Fatalf("unknown token = %d %v", code, err)
	}
}

func TestCloseReleasesPollers(t *testing.T) {
	sim, _ := newSim(t)
	_, enc := mint(t, sim, "poller", "self-hosted")
	ch := acquireAsync(t, context.Background(), sim, enc)
	testkit.Eventually(t, waitLimit, "runner online", func() bool { return sim.Runners()[0].Status == "online" })
	start := time.Now()
	if err := sim.Close(); err != nil {
		t.Fatal(err)
	}
	if res := recv(t, ch); res.code != http.StatusServiceUnavailable || time.Since(start) > 5*time.Second {
		t.Fatalf("poll after Close = %+v after %v", res, time.Since(start))
	}
}

// Given a job that takes no time, when its runner acquires and completes
// it, then the runner does both on one connection, as a runner process
// does; only a runner whose job runs a second or more lets go of its
// connection while it runs. Before, every zero-second job of the bench's
// throughput phase dialled the sim twice.
func TestAShortJobsRunnerCompletesOnTheConnectionItAcquiredOn(t *testing.T) {
	sim, _ := newSim(t)
	jobID := sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted", "linux"}})
	_, enc := mint(t, sim, "berth-runner-short", "self-hosted", "linux", "x64")
	before := sim.Accepted()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := ghsim.RunRunner(ctx, enc, nil); err != nil {
		t.Fatalf("RunRunner: %v", err)
	}
	if j := job(t, sim, jobID); j.Status != ghsim.StatusCompleted {
		t.Fatalf("job after run: %+v", j)
	}
	if dialled := sim.Accepted() - before; dialled != 1 {
		t.Errorf("the runner dialled the sim %d times for a job of 0 s, want once", dialled)
	}
}
