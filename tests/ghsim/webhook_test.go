package ghsim_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/google/go-github/v62/github"

	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/tests/ghsim"
)

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestSignMatchesGitHubTestVector(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(fixturesDir(t), "webhooks", "signature-test-vector.json"))
	if err != nil {
		t.Fatal(err)
	}
	var vec map[string]any
	if err := json.Unmarshal(raw, &vec); err != nil {
		t.Fatal(err)
	}
	secret, payload, want := findString(vec, "secret"), findString(vec, "payload"), findString(vec, "X-Hub-Signature-256")
	if secret == "" || payload == "" || want == "" {
		t.Fatalf("test vector fields not found in %s", raw)
	}
	if got := ghsim.Sign(secret, []byte(payload)); got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
	if err := github.ValidateSignature(want, []byte(payload), []byte(secret)); err != nil {
		t.Fatal(err)
	}
}

// findString returns the first string value under key anywhere in v.
func findString(v any, key string) string {
	switch x := v.(type) {
	case map[string]any:
		if s, ok := x[key].(string); ok {
			return s
		}
		for _, e := range x {
			if s := findString(e, key); s != "" {
				return s
			}
		}
	case []any:
		for _, e := range x {
			if s := findString(e, key); s != "" {
				return s
			}
		}
	}
	return ""
}

func TestQueuedWebhookSignedAndParsable(t *testing.T) {
	sim, rc := newSim(t)
	jobID := sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted", "linux", "gpu"}})
	testkit.Eventually(t, waitLimit, "queued webhook", func() bool { return len(rc.all()) == 1 })
	r := rc.all()[0]
	if r.sigErr != nil {
		t.Fatalf("ValidatePayload: %v", r.sigErr)
	}
	if r.event != "workflow_job" || !uuidRE.MatchString(r.delivery) || r.userAgent != "GitHub-Hookshot/sim" || r.hookID == "" {
		t.Fatalf("headers: %+v", r)
	}
	if err := github.ValidateSignature(ghsim.Sign("wrong", r.body), r.body, []byte(testSecret)); err == nil {
		t.Fatal("signature with the wrong secret validated")
	}
	evs := jobEvents(t, rc, jobID)
	if len(evs) != 1 {
		t.Fatalf("events = %d", len(evs))
	}
	ev, wj := evs[0], evs[0].GetWorkflowJob()
	if ev.GetAction() != "queued" || wj.GetStatus() != "queued" || len(wj.Labels) != 3 || wj.Labels[2] != "gpu" ||
		wj.RunnerName != nil || ev.GetRepo().GetName() != testRepo || ev.GetRepo().GetOwner().GetLogin() != testOrg {
		t.Fatalf("queued event: %+v / %+v", ev, wj)
	}
	d := sim.Deliveries()
	if len(d) != 1 || d[0].ID != r.delivery || d[0].Event != "workflow_job" || d[0].Action != "queued" ||
		d[0].JobID != jobID || d[0].StatusCode != 200 || !d[0].Done || d[0].Err != "" || string(d[0].Body) != string(r.body) {
		t.Fatalf("deliveries: %+v", d)
	}
}

func TestWebhooksKeepProductionOrder(t *testing.T) {
	sim, rc := newSim(t)
	var ids []int64
	for range 25 {
		ids = append(ids, sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted"}}))
	}
	testkit.Eventually(t, waitLimit, "25 webhooks", func() bool { return len(rc.all()) == 25 })
	seen := map[string]bool{}
	for i, r := range rc.all() {
		var p struct {
			WorkflowJob struct{ ID int64 } `json:"workflow_job"`
		}
		if err := json.Unmarshal(r.body, &p); err != nil || p.WorkflowJob.ID != ids[i] {
			t.Fatalf("webhook %d is job %d, want %d (%v)", i, p.WorkflowJob.ID, ids[i], err)
		}
		if seen[r.delivery] {
			t.Fatalf("delivery id %s reused", r.delivery)
		}
		seen[r.delivery] = true
	}
}

func TestRedeliverKeepsDeliveryID(t *testing.T) {
	sim, rc := newSim(t)
	sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted"}})
	testkit.Eventually(t, waitLimit, "first delivery", func() bool { return len(rc.all()) == 1 })
	id := sim.Deliveries()[0].ID
	if err := sim.Redeliver(id); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, waitLimit, "redelivery", func() bool { return len(rc.all()) == 2 })
	got := rc.all()
	if got[1].delivery != id || string(got[1].body) != string(got[0].body) || got[1].sigErr != nil {
		t.Fatalf("redelivery: %+v vs %+v", got[1], got[0])
	}
	d := sim.Deliveries()
	if len(d) != 2 || d[1].ID != id || !d[1].Redelivery || d[0].Redelivery {
		t.Fatalf("deliveries: %+v", d)
	}
	if err := sim.Redeliver("no-such-delivery"); err == nil {
		t.Fatal("Redeliver(unknown) succeeded")
	}
}

// Given a sim that keeps 2 deliveries, when 6 jobs are queued, then every
// webhook is still sent, the sim remembers at most twice that many (the
// newest among them), and the oldest can no longer be redelivered.
func TestASimThatKeepsFewDeliveriesForgetsTheOldest(t *testing.T) {
	sim, rc := newSim(t, func(c *ghsim.Config) { c.KeepDeliveries = 2 })
	sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted"}})
	testkit.Eventually(t, waitLimit, "first delivery", func() bool { return len(rc.all()) == 1 })
	oldest := sim.Deliveries()[0].ID
	for range 5 {
		sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted"}})
	}
	testkit.Eventually(t, waitLimit, "six deliveries sent", func() bool { return len(rc.all()) == 6 })
	d := sim.Deliveries()
	if len(d) < 2 || len(d) > 4 {
		t.Fatalf("the sim remembers %d deliveries, want 2 to 4", len(d))
	}
	if newest := rc.all()[5].delivery; d[len(d)-1].ID != newest {
		t.Fatalf("the newest delivery remembered is %s, want %s", d[len(d)-1].ID, newest)
	}
	if err := sim.Redeliver(oldest); err == nil {
		t.Fatal("the oldest delivery, forgotten, was redelivered")
	}
}

func TestFailedDeliveriesAreRecordedNotRetried(t *testing.T) {
	sim, rc := newSim(t)
	rc.setStatus(http.StatusInternalServerError)
	sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted"}})
	testkit.Eventually(t, waitLimit, "failed delivery recorded", func() bool { d := sim.Deliveries(); return len(d) == 1 && d[0].Done })
	if d := sim.Deliveries()[0]; d.StatusCode != 500 || d.Err != "" {
		t.Fatalf("delivery: %+v", d)
	}
	rc.setStatus(http.StatusOK)
	sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted"}})
	testkit.Eventually(t, waitLimit, "second delivery", func() bool { d := sim.Deliveries(); return len(d) == 2 && d[1].Done })
	if n := len(rc.all()); n != 2 {
		t.Fatalf("receiver saw %d requests, want 2 (no retry)", n)
	}

	// An unreachable endpoint is recorded with Err.
	dead, _ := newSim(t, func(c *ghsim.Config) { c.WebhookURL = "http://127.0.0.1:1/webhook" })
	dead.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted"}})
	testkit.Eventually(t, waitLimit, "unreachable delivery recorded", func() bool { d := dead.Deliveries(); return len(d) == 1 && d[0].Done })
	if d := dead.Deliveries()[0]; d.StatusCode != 0 || d.Err == "" {
		t.Fatalf("unreachable delivery: %+v", d)
	}
}

// Given HookSenders 4, when 12 jobs are queued while the receiver holds
// each delivery until a second one is in flight, then deliveries overlap
// (as GitHub's do) and each job's webhook arrives exactly once. With one
// sender the receiver would see one at a time (TestWebhooksKeepProductionOrder).
func TestSeveralSendersDeliverConcurrently(t *testing.T) {
	var mu sync.Mutex
	inflight, most := 0, 0
	overlap := make(chan struct{})
	var once sync.Once
	got := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		inflight++
		most = max(most, inflight)
		got[r.Header.Get("X-GitHub-Delivery")]++
		if inflight >= 2 {
			once.Do(func() { close(overlap) })
		}
		mu.Unlock()
		select { // hold until another delivery is in flight, at most 5 s
		case <-overlap:
		case <-time.After(5 * time.Second):
		}
		mu.Lock()
		inflight--
		mu.Unlock()
	}))
	defer srv.Close()
	sim, err := ghsim.New(ghsim.Config{WebhookURL: srv.URL, WebhookSecret: testSecret, Org: testOrg, Repo: testRepo,
		FixturesDir: fixturesDir(t), HookSenders: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	for range 12 {
		sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted"}})
	}
	testkit.Eventually(t, 10*time.Second, "12 deliveries", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 12
	})
	mu.Lock()
	defer mu.Unlock()
	if most < 2 {
		t.Errorf("at most %d delivery in flight at once, want deliveries to overlap", most)
	}
	for id, n := range got {
		if n != 1 {
			t.Errorf("delivery %s arrived %d times", id, n)
		}
	}
}
