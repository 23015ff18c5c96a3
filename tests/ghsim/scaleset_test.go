package ghsim_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/actions/scaleset"

	"github.com/berth-ci/berth/tests/ghsim"
)

// ssClient is the real scaleset client, pointed at the sim's org.
func ssClient(t *testing.T, sim *ghsim.Sim) *scaleset.Client {
	t.Helper()
	c, err := scaleset.NewClientWithPersonalAccessToken(scaleset.NewClientWithPersonalAccessTokenConfig{
		GitHubConfigURL: sim.URL() + "/" + testOrg, PersonalAccessToken: "ghp_test",
		SystemInfo: scaleset.SystemInfo{System: "berth-test"},
	}, scaleset.WithRetryMax(1), scaleset.WithRetryWaitMax(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// newSet creates (through the real client) a scale set named name with the
// given labels in the default runner group.
func newSet(t *testing.T, c *scaleset.Client, name string, labels ...string) *scaleset.RunnerScaleSet {
	t.Helper()
	ctx := context.Background()
	g, err := c.GetRunnerGroupByName(ctx, scaleset.DefaultRunnerGroup)
	if err != nil {
		t.Fatalf("GetRunnerGroupByName: %v", err)
	}
	var ls []scaleset.Label
	for _, l := range labels {
		ls = append(ls, scaleset.Label{Name: l})
	}
	set, err := c.CreateRunnerScaleSet(ctx, &scaleset.RunnerScaleSet{Name: name, RunnerGroupID: g.ID, Labels: ls})
	if err != nil {
		t.Fatalf("CreateRunnerScaleSet: %v", err)
	}
	return set
}

// poll reads the next message (nil on 202) and deletes it.
func poll(t *testing.T, s *scaleset.MessageSessionClient, last *int, capacity int) *scaleset.RunnerScaleSetMessage {
	t.Helper()
	ctx := context.Background()
	m, err := s.GetMessage(ctx, *last, capacity)
	if err != nil {
		t.Fatalf("GetMessage: %v", err)
	}
	if m != nil {
		*last = m.MessageID
		if err := s.DeleteMessage(ctx, m.MessageID); err != nil {
			t.Fatalf("DeleteMessage: %v", err)
		}
	}
	return m
}

func fastSim(c *ghsim.Config) { c.AcquireTimeout = 100 * time.Millisecond }

// Given a scale set created through the real client, when 60 jobs queue,
// then they arrive as JobAvailable in messages of at most 50, acquiring them
// assigns no more than the polled capacity, a set runner takes an assigned
// job (JobStarted, same job id and runner name as the REST view) and
// finishing it sends JobCompleted; a second session is refused with 409.
func TestScaleSetProtocolThroughRealClient(t *testing.T) {
	sim, _ := newSim(t, fastSim)
	c := ssClient(t, sim)
	ctx := context.Background()
	set := newSet(t, c, "pool-a", "self-hosted", "pool-a")
	if got, err := c.GetRunnerScaleSet(ctx, set.RunnerGroupID, "pool-a"); err != nil || got == nil || got.ID != set.ID {
		t.Fatalf("GetRunnerScaleSet by name = %+v, %v; want id %d", got, err, set.ID)
	}
	if _, err := c.UpdateRunnerScaleSet(ctx, set.ID, &scaleset.RunnerScaleSet{Name: "pool-a",
		Labels: []scaleset.Label{{Name: "self-hosted"}, {Name: "pool-a"}}}); err != nil {
		t.Fatalf("UpdateRunnerScaleSet: %v", err)
	}
	sess, err := c.MessageSessionClient(ctx, set.ID, "replica-1")
	if err != nil {
		t.Fatalf("MessageSessionClient: %v", err)
	}
	if _, err := c.MessageSessionClient(ctx, set.ID, "replica-2"); err == nil || !strings.Contains(err.Error(), "409") {
		t.Fatalf("second session: err %v, want a 409", err)
	}
	for range 60 {
		sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted", "pool-a"}})
	}
	last := 0
	var avail []int64
	for len(avail) < 60 {
		m := poll(t, sess, &last, 0)
		if m == nil {
			t.Fatalf("queue empty after %d offers, want 60", len(avail))
		}
		if len(m.JobAvailableMessages) > ghsim.MaxJobsPerMessage {
			t.Fatalf("message with %d jobs, over %d", len(m.JobAvailableMessages), ghsim.MaxJobsPerMessage)
		}
		for _, j := range m.JobAvailableMessages {
			avail = append(avail, j.RunnerRequestID)
		}
	}
	got, err := sess.AcquireJobs(ctx, avail)
	if err != nil || len(got) != 60 {
		t.Fatalf("AcquireJobs = %d ids, %v; want 60", len(got), err)
	}
	if m := poll(t, sess, &last, 0); m != nil && len(m.JobAssignedMessages) > 0 {
		t.Fatalf("capacity 0 assigned %d jobs", len(m.JobAssignedMessages))
	}
	m := poll(t, sess, &last, 5)
	if m == nil || len(m.JobAssignedMessages) != 5 || m.Statistics.TotalAssignedJobs != 5 {
		t.Fatalf("capacity 5: message %+v; want 5 JobAssigned and TotalAssignedJobs 5", m)
	}
	jit, err := c.GenerateJitRunnerConfig(ctx, &scaleset.RunnerScaleSetJitRunnerSetting{Name: "berth-r1"}, set.ID)
	if err != nil {
		t.Fatalf("GenerateJitRunnerConfig: %v", err)
	}
	code, a := acquire(t, ctx, sim, jit.EncodedJITConfig)
	if code != 200 || a.JobID != m.JobAssignedMessages[0].RunnerRequestID {
		t.Fatalf("set runner acquire = %d job %d; want the oldest assigned job %d", code, a.JobID, m.JobAssignedMessages[0].RunnerRequestID)
	}
	started := poll(t, sess, &last, 5)
	if started == nil || len(started.JobStartedMessages) != 1 || started.JobStartedMessages[0].RunnerName != "berth-r1" {
		t.Fatalf("after the runner took a job: %+v; want one JobStarted by berth-r1", started)
	}
	if v := job(t, sim, a.JobID); v.Status != ghsim.StatusInProgress || v.RunnerName != "berth-r1" {
		t.Fatalf("REST view of job %d: %+v; want in_progress on berth-r1", a.JobID, v)
	}
	if complete(t, sim, jit.EncodedJITConfig, a.JobID) != 200 {
		t.Fatal("complete failed")
	}
	done := poll(t, sess, &last, 5)
	if done == nil || len(done.JobCompletedMessages) != 1 || done.JobCompletedMessages[0].Result != "succeeded" {
		t.Fatalf("after completion: %+v; want one JobCompleted succeeded", done)
	}
	if _, err := c.GetRunner(ctx, jit.Runner.ID); err == nil {
		t.Fatal("the ephemeral runner is still registered after its job")
	}
}

// Given an open session, when its token expires the client refreshes it in
// place and keeps reading; when the session is evicted the client's call
// fails, a new session opens, and jobs not yet acquired are offered again.
func TestScaleSetSessionExpiryAndEviction(t *testing.T) {
	sim, _ := newSim(t, fastSim)
	c := ssClient(t, sim)
	ctx := context.Background()
	set := newSet(t, c, "pool-b", "pool-b")
	sess, err := c.MessageSessionClient(ctx, set.ID, "replica-1")
	if err != nil {
		t.Fatal(err)
	}
	id := sim.Enqueue(ghsim.JobSpec{Labels: []string{"pool-b"}})
	sim.ExpireSessionTokens()
	last := 0
	if m := poll(t, sess, &last, 1); m == nil || len(m.JobAvailableMessages) != 1 {
		t.Fatalf("after token expiry: %+v; want the JobAvailable, read through a refreshed token", m)
	}
	if sim.EvictSessions() != 1 {
		t.Fatal("no session evicted")
	}
	if _, err := sess.GetMessage(ctx, last, 1); err == nil {
		t.Fatal("GetMessage on an evicted session succeeded")
	}
	sess2, err := c.MessageSessionClient(ctx, set.ID, "replica-2")
	if err != nil {
		t.Fatalf("new session after eviction: %v", err)
	}
	m := poll(t, sess2, &last, 1)
	if m == nil || len(m.JobAvailableMessages) != 1 || m.JobAvailableMessages[0].RunnerRequestID != id {
		t.Fatalf("new session: %+v; want job %d offered again", m, id)
	}
	if err := c.RemoveRunner(ctx, 424242); err == nil {
		t.Fatal("removing an unknown runner succeeded")
	}
}

// Given message faults, then a dropped message's jobs never arrive, a
// duplicated one's arrive twice, an emptied one carries statistics only,
// and a delayed one arrives after the delay.
func TestScaleSetMessageFaults(t *testing.T) {
	sim, _ := newSim(t, fastSim)
	c := ssClient(t, sim)
	ctx := context.Background()
	set := newSet(t, c, "pool-c", "pool-c")
	sess, err := c.MessageSessionClient(ctx, set.ID, "r")
	if err != nil {
		t.Fatal(err)
	}
	faults := []ghsim.MessageFault{ghsim.Drop, ghsim.Duplicate, ghsim.Deliver, ghsim.Empty, ghsim.Delay, ghsim.Deliver}
	sim.MessageFaults(func(v ghsim.MessageView) (ghsim.MessageFault, time.Duration) {
		return faults[(v.ID-1)%len(faults)], 60 * time.Millisecond
	})
	last := 0
	offers := func() int {
		sim.Enqueue(ghsim.JobSpec{Labels: []string{"pool-c"}})
		m := poll(t, sess, &last, 0)
		if m == nil {
			return -1
		}
		return len(m.JobAvailableMessages)
	}
	if n := offers(); n != -1 {
		t.Fatalf("dropped message: the poll got %d offers, want none (202)", n)
	}
	if n := offers(); n != 1 {
		t.Fatalf("duplicated message: %d offers, want 1 (the second job)", n)
	}
	if m := poll(t, sess, &last, 0); m == nil || len(m.JobAvailableMessages) != 1 {
		t.Fatalf("duplicate: %+v; want the second job again", m)
	}
	if n := offers(); n != 0 {
		t.Fatalf("emptied message carried %d offers, want 0", n)
	}
	start := time.Now()
	if n := offers(); n != 1 || time.Since(start) < 50*time.Millisecond {
		t.Fatalf("delayed message: %d offers after %v; want 1 after the delay", n, time.Since(start))
	}
	if got := sim.ScaleSets()[0].Stats["totalAvailableJobs"]; got != 4 {
		t.Fatalf("statistics: %d available, want 4 (every job, whatever its messages)", got)
	}
}
