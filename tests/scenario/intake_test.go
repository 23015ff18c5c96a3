package scenario

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/tests/ghsim"
)

// GitHub intake as real fleets meet it (issue 5): lost, redelivered and
// repeated webhooks, runners that swap jobs, rate-limited mints. Each test
// drives the real services through the simulator.

// asApp makes the dispatcher authenticate as a GitHub App installation
// (a fresh RSA key; the simulator mints installation tokens for any JWT) and
// redeliver failed webhook deliveries through the App's hook-deliveries API
// every reconcile round, one round a second.
func asApp(t *testing.T) func(*config.Config) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "app.pem")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		t.Fatal(err)
	}
	return func(c *config.Config) {
		d := &c.Dispatcher
		d.GitHub.App = config.GitHubApp{ID: 1, InstallationID: 7654321, PrivateKeyFile: file}
		d.ReconcileEvery, d.ReconcileRedeliver = time.Second, true
	}
}

// BL-12 (variant: the queued delivery never arrived), and a job whose
// webhook was lost is served after reconcile: given a dispatcher that
// redelivers failed deliveries, when GitHub fails to deliver job 1's queued
// webhook (the dispatcher was unreachable) and does not retry it, then a
// reconcile round finds the failed delivery in the App's hook deliveries,
// asks GitHub to redeliver it, the redelivery (same X-GitHub-Delivery) is
// stored and the job is served with one slot and one VM. And when job 2's
// queued delivery reached the dispatcher but GitHub recorded it as failed
// (the answer came too late), it is in the log: it is never redelivered.
func TestALostWebhookIsServedAfterARedeliveryAndAStoredOneIsNotRedelivered(t *testing.T) {
	w := start(t, asApp(t))
	sim := w.f.Sim
	sim.LoseDeliveries(func(d ghsim.DeliveryView) bool { return d.Action == "queued" && !d.Redelivery })
	j1 := w.enqueue(linuxLabels, 200*time.Millisecond)
	lost := w.delivery(j1, "queued", false)
	w.await("job 1's queued delivery is lost", 10*time.Second, func() bool { return w.deliveryOf(lost).Done })
	sim.LoseDeliveries(nil)
	if d := w.deliveryOf(lost); d.StatusCode != 0 {
		t.Fatalf("the lost delivery reached the dispatcher: %+v", d)
	}

	w.await("job 1 is served after the redelivery", 45*time.Second, w.jobIs(j1, ghsim.StatusCompleted))
	w.await("job 1's queued fact is stored", 10*time.Second, func() bool { return len(w.jobFacts(events.TypeJobQueued, j1)) > 0 })
	if q := w.jobFacts(events.TypeJobQueued, j1); len(q) != 1 || q[0].Data.(*events.JobQueued).Delivery != lost {
		t.Fatalf("job 1's queued facts %v, want one, from the redelivered %s", q, lost)
	}
	if r := w.job(j1).RunnerName; r != events.AttemptID(j1, 1) {
		t.Fatalf("job 1 ran on %q, want its own first attempt", r)
	}

	sim.TimeOutDeliveries(func(d ghsim.DeliveryView) bool { return d.Action == "queued" && !d.Redelivery })
	j2 := w.enqueue(linuxLabels, 200*time.Millisecond)
	late := w.delivery(j2, "queued", false)
	w.await("job 2's queued delivery is stored, yet listed as failed", 10*time.Second, func() bool {
		return w.deliveryOf(late).Done && len(w.jobFacts(events.TypeJobQueued, j2)) == 1
	})
	w.await("job 2 is served", 30*time.Second, w.jobIs(j2, ghsim.StatusCompleted))
	w.caughtUp()
	rounds := sim.APICalls()[ghsim.RouteHookDeliveriesApp]
	w.await("three more reconcile rounds", 20*time.Second, func() bool {
		return sim.APICalls()[ghsim.RouteHookDeliveriesApp] >= rounds+3
	})
	for _, d := range sim.Deliveries() {
		if d.Redelivery && d.ID != lost {
			t.Errorf("delivery %s (job %d, %s) was redelivered: the log holds it", d.ID, d.JobID, d.Action)
		}
	}
	if n := sim.APICalls()[ghsim.RouteRedeliverApp]; n != 1 {
		t.Errorf("%d redelivery requests, want 1 (job 1's lost queued delivery, once)", n)
	}
	for _, j := range []int64{j1, j2} {
		if n := len(w.jobFacts(events.TypeSlotReserved, j)); n != 1 {
			t.Errorf("job %d: %d slots booked, want 1", j, n)
		}
	}
	w.checkLedger()
}

// BL-18: given a job whose queued delivery was stored, when GitHub
// redelivers it twice (same X-GitHub-Delivery) and the same payload comes
// again under a new delivery id (a manual re-send), then every copy is
// answered 2xx, one slot is booked and one VM created for the job, and the
// job is served once.
func TestARedeliveredAndARepeatedWebhookCreateNoSecondVM(t *testing.T) {
	w := start(t, nil)
	sim := w.f.Sim
	j := w.enqueue(linuxLabels, 2*time.Second)
	a := events.AttemptID(j, 1)
	first := w.delivery(j, "queued", false)
	w.await("the queued fact is stored", 10*time.Second, func() bool { return len(w.jobFacts(events.TypeJobQueued, j)) == 1 })
	for range 2 {
		if err := sim.Redeliver(first); err != nil {
			t.Fatal(err)
		}
	}
	if code := w.post("workflow_job", "manual-"+first, w.deliveryOf(first).Body); code != http.StatusAccepted {
		t.Fatalf("the re-sent payload was answered %d, want 202", code)
	}
	w.await("the job is served", 30*time.Second, w.jobIs(j, ghsim.StatusCompleted))
	w.await("both redeliveries answered", 10*time.Second, func() bool {
		n := 0
		for _, d := range sim.Deliveries() {
			if d.Redelivery && d.ID == first && d.Done && d.StatusCode == http.StatusAccepted {
				n++
			}
		}
		return n == 2
	})
	w.await("the VM is stopped", 10*time.Second, w.has(events.TypeAttemptStopped, a))
	w.caughtUp()
	if n := len(w.jobFacts(events.TypeSlotReserved, j)); n != 1 {
		t.Errorf("%d slots booked for one job, want 1", n)
	}
	if n := len(w.jobFacts(events.TypeAttemptPlaced, j)); n != 1 {
		t.Errorf("%d placements for one job, want 1", n)
	}
	if c := w.calls("host-a", "create", a); c.starts != 1 {
		t.Errorf("%d creates for the job's VM, want 1", c.starts)
	}
	if n := len(w.facts(events.TypeAttemptProvisioning, "")); n != 1 {
		t.Errorf("%d VMs provisioned in all, want 1", n)
	}
	if n := len(w.jobFacts(events.TypeJobQueued, j)); n != 2 {
		t.Errorf("%d queued facts, want 2: GitHub's delivery (its redeliveries deduplicated) and the re-send under a new id", n)
	}
	w.checkLedger()
}

// BL-15: given two jobs with the same labels, each booked a VM, when
// GitHub hands job 1 to the runner booked for job 2 and job 2 to the runner
// booked for job 1, then job 2's completion stops the VM that ran job 2
// (booked for job 1) while the VM running job 1 keeps running, and job 1's
// completion then stops that one: one release per job, no job killed.
func TestRunnersThatSwapJobsEachCompletionStopsTheVMThatRanIt(t *testing.T) {
	w := start(t, func(c *config.Config) {
		c.Watchdog.ProvisionTimeout = 30 * time.Second
		execOf(&c.Agents[0]).CreateTimeout = 30 * time.Second
	})
	w.fault("host-a", "create-hang", "*")
	j1 := w.enqueue(linuxLabels, 6*time.Second)
	a1 := events.AttemptID(j1, 1)
	w.await("job 1's VM is booting", 10*time.Second, func() bool { return w.calls("host-a", "create", a1).inFlight() })
	j2 := w.enqueue(linuxLabels, 500*time.Millisecond)
	a2 := events.AttemptID(j2, 1)
	w.await("job 2's VM is booting", 10*time.Second, func() bool { return w.calls("host-a", "create", a2).inFlight() })

	// Job 2's VM comes up first; its runner is handed the oldest job, job 1.
	w.release("host-a", a2)
	w.await("job 1 runs on the VM booked for job 2", 15*time.Second, func() bool {
		v := w.job(j1)
		return v.Status == ghsim.StatusInProgress && v.RunnerName == a2
	})
	w.clearFault("host-a", "create-hang")
	w.release("host-a", a1)
	w.await("job 2 runs on the VM booked for job 1", 15*time.Second, func() bool {
		v := w.job(j2)
		return v.Status == ghsim.StatusInProgress && v.RunnerName == a1
	})

	w.await("job 2 completes", 15*time.Second, w.jobIs(j2, ghsim.StatusCompleted))
	w.awaitFact(events.TypeAttemptTeardownRequested, a1, 5*time.Second)
	if w.job(j1).Status != ghsim.StatusInProgress {
		t.Fatal("job 1 ended before the check: the scenario did not hold it open")
	}
	if w.has(events.TypeAttemptTeardownRequested, a2)() || !w.runnerAlive("host-a", a2) {
		t.Fatal("job 2's completion tore down the VM running job 1")
	}
	w.await("job 1 completes", 20*time.Second, w.jobIs(j1, ghsim.StatusCompleted))
	if v := w.job(j1); v.Conclusion != ghsim.ConclusionSuccess {
		t.Fatalf("job 1 ended %s, want success: its VM was stopped under it", v.Conclusion)
	}
	w.awaitFact(events.TypeAttemptTeardownRequested, a2, 5*time.Second)
	w.caughtUp()
	for a, job := range map[string]int64{a1: j2, a2: j1} {
		rel := w.facts(events.TypeSlotReleased, a)
		if len(rel) != 1 || rel[0].Data.(*events.SlotReleased).Reason != events.ReleaseCompleted {
			t.Errorf("%s (ran job %d): releases %v, want one, for completion", a, job, rel)
		}
	}
	w.await("nothing held or alive", 10*time.Second, func() bool {
		st := w.status()
		return poolStatus(st, "linux").Held == 0 && hostStatus(st, "host-a").LiveVMs == 0
	})
	w.checkLedger()
}

// BL-12, BL-37: given GitHub answering the JIT-config call with a rate
// limit, in each of its three shapes (primary: 403 with remaining 0 and a
// reset; secondary: 403 with Retry-After; 429 with Retry-After), the job
// stays demand and holds no slot while it waits (its booking goes back as
// rate_limited, which is no failed attempt; it is never unschedulable), no
// JIT-config call is made before GitHub's wait is over, and the job is
// served after it with one runner registration.
func TestARateLimitedMintKeepsTheJobAsDemandAndServesItAfterTheReset(t *testing.T) {
	for _, shape := range []ghsim.RateLimitShape{ghsim.PrimaryLimit, ghsim.SecondaryForbidden, ghsim.TooManyRequests} {
		t.Run(shape.String(), func(t *testing.T) {
			w := start(t, nil)
			sim := w.f.Sim
			const wait = 3 * time.Second
			sim.RateLimit(ghsim.RouteJITConfigOrg, shape, 1, wait)
			j := w.enqueue(linuxLabels, 200*time.Millisecond)
			w.await("the JIT-config call is refused", 15*time.Second, func() bool { return sim.APICalls()[ghsim.RouteJITConfigOrg] >= 1 })
			// GitHub's wait ends no sooner than wait-1s from here: the
			// primary shape's reset is in whole seconds. Every check of
			// "while it waits" happens before then, or the dispatcher
			// rightly books the job again.
			over := time.Now().Add(wait - time.Second)
			held := func() int { return poolStatus(w.status(), "linux").Held }
			w.await("the refused booking's slot goes back", time.Until(over), func() bool { return held() == 0 })
			w.never("a JIT-config call or a held slot before GitHub's wait is over", time.Until(over), func() bool {
				return sim.APICalls()[ghsim.RouteJITConfigOrg] > 1 || held() != 0
			})
			var job events.Job
			var failed int
			if err := w.f.Sys.Dispatcher.Read(w.ctx, func(f *events.Fleet) {
				if j := f.Jobs[j]; j != nil {
					job, failed = *j, j.FailedAttempts
				}
			}); err != nil {
				t.Fatal(err)
			}
			if !job.Demand() || failed != 0 {
				t.Fatalf("while rate limited the job is %v (unschedulable %v, %d failed attempts), want demand", job.Status, job.Unschedulable, failed)
			}
			w.await("the job is served after the wait", 40*time.Second, w.jobIs(j, ghsim.StatusCompleted))
			reasons := map[string]int{}
			w.await("the slot is released at the completion", 10*time.Second, func() bool {
				clear(reasons)
				for _, e := range w.jobFacts(events.TypeSlotReleased, j) {
					reasons[e.Data.(*events.SlotReleased).Reason]++
				}
				return reasons[events.ReleaseCompleted] > 0
			})
			w.caughtUp()
			if len(reasons) != 2 || reasons[events.ReleaseRateLimited] != 1 || reasons[events.ReleaseCompleted] != 1 {
				t.Errorf("releases %v, want one rate_limited (the refused booking) and one completed", reasons)
			}
			if n := len(w.jobFacts(events.TypeJobUnschedulable, j)); n != 0 {
				t.Error("the job was given up on")
			}
			if n := len(w.jobFacts(events.TypeAttemptPlaced, j)); n != 1 {
				t.Errorf("%d placements, want 1", n)
			}
			if n := sim.APICalls()[ghsim.RouteJITConfigOrg]; n > 3 {
				t.Errorf("%d JIT-config calls for one job, want at most 3", n)
			}
			w.checkLedger()
		})
	}
}

// caughtUp waits until the test's copy of the log holds every fact stored
// so far, so that counting facts after a wait sees them all.
func (w *world) caughtUp() {
	w.t.Helper()
	last, err := eventlog.LastSeq(w.ctx, w.js)
	if err != nil {
		w.t.Fatal(err)
	}
	w.await("the test's copy of the log catches up", 10*time.Second, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.log) > 0 && w.log[len(w.log)-1].Seq >= last
	})
}

// delivery is the id of the first delivery the simulator made for a job's
// action (a redelivery or not), waiting for it to be queued.
func (w *world) delivery(job int64, action string, redelivery bool) string {
	w.t.Helper()
	var id string
	w.await("a "+action+" delivery for the job", 5*time.Second, func() bool {
		for _, d := range w.f.Sim.Deliveries() {
			if d.JobID == job && d.Action == action && d.Redelivery == redelivery {
				id = d.ID
				return true
			}
		}
		return false
	})
	return id
}

// deliveryOf is the first (not redelivered) attempt of a delivery.
func (w *world) deliveryOf(id string) ghsim.DeliveryView {
	for _, d := range w.f.Sim.Deliveries() {
		if d.ID == id && !d.Redelivery {
			return d
		}
	}
	w.t.Fatalf("the simulator made no delivery %s", id)
	return ghsim.DeliveryView{}
}

// post sends a signed delivery to the dispatcher's webhook intake and
// returns the status code.
func (w *world) post(event, delivery string, body []byte) int {
	w.t.Helper()
	req, _ := http.NewRequestWithContext(w.ctx, http.MethodPost, "http://"+w.f.Sys.DispatcherAddr+"/webhook", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Event", event)
	req.Header.Set("X-GitHub-Delivery", delivery)
	req.Header.Set("X-Hub-Signature-256", ghsim.Sign(w.f.Config.Dispatcher.WebhookSecret, body))
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		w.t.Fatalf("deliver %s: %v", delivery, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// BL-22 (registrations left behind), and a JIT runner that never started
// is deleted through the API: given a first attempt whose VM comes up
// without its runner ever connecting, when the registration deadline
// releases it, then its JIT registration, which GitHub would otherwise list
// offline for a day, is deleted through the API (DELETE
// /orgs/{org}/actions/runners/{id}) once, the job is served by a second
// attempt, and no registration of Berth's is left on GitHub.
func TestARegistrationWhoseRunnerNeverConnectedIsDeleted(t *testing.T) {
	w := start(t, func(c *config.Config) { c.Watchdog.RegistrationTimeout = 2 * time.Second })
	w.fault("host-a", "create-no-runner", "berth-*-1")
	sim := w.f.Sim

	j := w.enqueue(linuxLabels, 200*time.Millisecond)
	a1 := events.AttemptID(j, 1)
	w.await("attempt 1's runner is registered on GitHub", 10*time.Second, func() bool {
		for _, r := range sim.Runners() {
			if r.Name == a1 {
				return true
			}
		}
		return false
	})
	w.await("the job is served by attempt 2", 20*time.Second, w.jobIs(j, ghsim.StatusCompleted))
	w.await("attempt 1's registration is deleted", 10*time.Second, func() bool {
		for _, r := range sim.Runners() {
			if r.Name == a1 {
				return false
			}
		}
		return true
	})
	w.awaitFact(events.TypeAttemptDeregistered, a1, 5*time.Second)
	w.await("no registration is left", 10*time.Second, func() bool { return len(sim.Runners()) == 0 })
	w.caughtUp()
	if n := sim.APICalls()[ghsim.RouteDeleteRunnerOrg]; n != 1 {
		t.Errorf("%d runner deletions, want 1 (attempt 1's; GitHub removes an ephemeral runner after its job)", n)
	}
	if n := len(w.facts(events.TypeAttemptDeregistered, a1)); n != 1 {
		t.Errorf("attempt 1 deregistered %d times, want once", n)
	}
	w.checkLedger()
}

// BL-12 (variant: GitHub never sent the queued webhook at all, so there is
// no failed delivery to redeliver either), and a job whose webhook was lost
// is served after reconcile: given a repository Berth already knows, when a
// job's queued webhook never arrives, then the reconcile poll lists the
// repository's queued jobs, stores the queued fact the webhook would have
// carried (no delivery id: its id is job-<id>-queued) and the job is served
// with one slot, within a few reconcile rounds.
func TestAJobWhoseQueuedWebhookNeverCameIsFoundByTheReconcilePoll(t *testing.T) {
	w := start(t, func(c *config.Config) { c.Dispatcher.ReconcileEvery = time.Second })
	sim := w.f.Sim
	j0 := w.enqueue(linuxLabels, 200*time.Millisecond)
	w.await("a first job is served as usual", 20*time.Second, w.jobIs(j0, ghsim.StatusCompleted))

	sim.LoseDeliveries(func(d ghsim.DeliveryView) bool { return d.Action == "queued" })
	j := w.enqueue(linuxLabels, 200*time.Millisecond)
	w.await("the job is served", 20*time.Second, w.jobIs(j, ghsim.StatusCompleted))
	w.await("its completion is stored", 10*time.Second, func() bool { return len(w.jobFacts(events.TypeJobCompleted, j)) > 0 })
	w.caughtUp()
	q := w.jobFacts(events.TypeJobQueued, j)
	if len(q) != 1 || q[0].Data.(*events.JobQueued).Delivery != "" || q[0].ID != "job-"+strconv.FormatInt(j, 10)+"-queued" {
		t.Fatalf("queued facts %v, want one from the reconcile poll", q)
	}
	if n := len(w.jobFacts(events.TypeSlotReserved, j)); n != 1 {
		t.Errorf("%d slots booked, want 1", n)
	}
	if sim.APICalls()[ghsim.RouteListRunJobs] == 0 {
		t.Error("the poll never read a run's jobs")
	}
	w.checkLedger()
}
