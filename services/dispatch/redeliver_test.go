package dispatch_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/dispatch"
)

// Given the hook's recent deliveries, the redelivery round asks only for
// failed workflow_job deliveries younger than 3 days that no attempt
// delivered and whose GUID the log does not hold, once per GUID, oldest
// first, at most the limit, and none it asked for already.
func TestRedeliveryAsksOnlyForFailedDeliveriesTheLogLacks(t *testing.T) {
	in := func(guid string) *events.JobQueued {
		q := queued(1)
		q.Delivery = guid
		return q
	}
	l := given(t).add(in("stored-but-answered-late"))
	now := t0.Add(time.Hour)
	row := func(id int64, guid string, ago time.Duration, code int) dispatch.HookDelivery {
		return dispatch.HookDelivery{ID: id, GUID: guid, DeliveredAt: now.Add(-ago), StatusCode: code, Event: "workflow_job", Action: "queued"}
	}
	rows := []dispatch.HookDelivery{ // newest first, as GitHub lists them
		row(9, "lost-newer", time.Minute, 0),
		row(8, "redelivered-ok", 2*time.Minute, 202),
		row(7, "lost-twice", 3*time.Minute, 503),
		row(6, "lost-twice", 4*time.Minute, 0),
		row(5, "redelivered-ok", 5*time.Minute, 0),
		row(4, "stored-but-answered-late", 6*time.Minute, 0),
		row(3, "lost-older", 7*time.Minute, 500),
		row(2, "too-old", dispatch.RedeliverWithin, 0),
		{ID: 1, GUID: "a-ping", DeliveredAt: now.Add(-time.Minute), StatusCode: 0, Event: "ping"},
		row(10, "asked-already", time.Minute, 0),
	}
	asked := func(guid string) bool { return guid == "asked-already" }
	got := dispatch.RedeliveryCandidates(l.f, rows, now, 0, asked)
	var guids []string
	for _, g := range got {
		guids = append(guids, g.GUID)
	}
	if want := "lost-older lost-twice lost-newer"; strings.Join(guids, " ") != want {
		t.Fatalf("asked for %v, want %s", guids, want)
	}
	if got[1].ID != 7 {
		t.Fatalf("lost-twice asked through attempt %d, want the newest, 7", got[1].ID)
	}
	if got := dispatch.RedeliveryCandidates(l.f, rows, now, 2, asked); len(got) != 2 || got[0].GUID != "lost-older" {
		t.Fatalf("limit 2: %+v", got)
	}
}

// The delivery ids of stored job facts are part of the fold and its
// snapshot, and are forgotten only after GitHub's redelivery window.
func TestTheFoldRemembersDeliveriesForTheRedeliveryWindow(t *testing.T) {
	q := queued(1)
	q.Delivery = "d-1"
	l := given(t).add(q)
	if _, ok := l.f.Deliveries["d-1"]; !ok {
		t.Fatal("a stored delivery is not in the fold")
	}
	b, err := events.MarshalSnapshot(l.f)
	if err != nil {
		t.Fatal(err)
	}
	f, err := events.UnmarshalSnapshot(b)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := f.Deliveries["d-1"]; !ok {
		t.Fatal("the snapshot lost the delivery ids")
	}
	f.Compact(t0.Add(events.DeliveryMemory-time.Minute), time.Hour)
	if _, ok := f.Deliveries["d-1"]; !ok {
		t.Fatal("a delivery forgotten inside GitHub's redelivery window")
	}
	f.Compact(t0.Add(events.DeliveryMemory+time.Minute), time.Hour)
	if len(f.Deliveries) != 0 {
		t.Fatalf("deliveries kept past the window: %v", f.Deliveries)
	}
}

// GitHubRedeliverer speaks the three hook-deliveries APIs: the App's, an
// organization hook's and a repository hook's; it pages back no further
// than asked and takes GitHub's 202 as success.
func TestGitHubRedelivererCallsTheHooksEndpoints(t *testing.T) {
	var mu sync.Mutex
	var calls []string
	now := time.Now().UTC()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls = append(calls, r.Method+" "+r.URL.Path)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusAccepted)
			_, _ = w.Write([]byte("{}"))
			return
		}
		if r.URL.Query().Get("cursor") == "" {
			w.Header().Set("Link", `<http://`+r.Host+r.URL.Path+`?per_page=100&cursor=v1_2>; rel="next"`)
			_ = json.NewEncoder(w).Encode([]map[string]any{
				{"id": 2, "guid": "g-2", "delivered_at": now.Format(time.RFC3339), "status_code": 0, "event": "workflow_job", "action": "queued"},
			})
			return
		}
		_ = json.NewEncoder(w).Encode([]map[string]any{
			{"id": 1, "guid": "g-1", "delivered_at": now.Add(-4 * 24 * time.Hour).Format(time.RFC3339), "status_code": 0, "event": "workflow_job"},
		})
	}))
	defer srv.Close()
	gh, err := dispatch.NewGitHubClient(srv.URL, "t", srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range []struct {
		r    *dispatch.GitHubRedeliverer
		path string
	}{
		{&dispatch.GitHubRedeliverer{Client: gh, Budget: &dispatch.Budget{}}, "/app/hook/deliveries"},
		{&dispatch.GitHubRedeliverer{Client: gh, Org: "example-org", HookID: 42}, "/orgs/example-org/hooks/42/deliveries"},
		{&dispatch.GitHubRedeliverer{Client: gh, Org: "example-org", Repo: "example-repo", HookID: 42}, "/repos/example-org/example-repo/hooks/42/deliveries"},
	} {
		mu.Lock()
		calls = nil
		mu.Unlock()
		rows, err := c.r.HookDeliveries(ctx, now.Add(-dispatch.RedeliverWithin), 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 1 || rows[0].GUID != "g-2" || rows[0].ID != 2 || rows[0].Event != "workflow_job" {
			t.Fatalf("%s: rows %+v, want only g-2 (g-1 is older than the window)", c.path, rows)
		}
		if err := c.r.Redeliver(ctx, 2); err != nil {
			t.Fatalf("%s: redeliver: %v", c.path, err)
		}
		mu.Lock()
		want := "GET " + c.path + " GET " + c.path + " POST " + c.path + "/2/attempts"
		if got := strings.Join(calls, " "); got != want {
			t.Errorf("calls %q, want %q", got, want)
		}
		mu.Unlock()
	}
}

// The reconcile poll's search for jobs no webhook told of: it searches
// every repository a job fact in the fold names, and a listed queued job becomes
// a queued fact only when the fold does not know the job (a job the log
// knows, in whatever state, is left to its own facts).
func TestThePollStoresOnlyQueuedJobsTheLogDoesNotKnow(t *testing.T) {
	q, c := queued(1), completed(2, "", "cancelled")
	q.Org, q.Repo, c.Org, c.Repo = "example-org", "example-repo", "example-org", "example-repo"
	l := given(t).add(q, c)
	if repos := dispatch.ReconcileRepos(l.f, ""); len(repos) != 1 || repos[0] != [2]string{"example-org", "example-repo"} {
		t.Fatalf("repos %v", repos)
	}
	listed := []dispatch.QueuedJob{
		{ID: 1, Org: "example-org", Repo: "example-repo"},
		{ID: 2, Org: "example-org", Repo: "example-repo"},
		{ID: 3, RunID: 30, Org: "example-org", Repo: "example-repo", Name: "build", Labels: []string{"self-hosted", "linux"}},
	}
	got := dispatch.UnknownQueued(l.f, listed, "")
	if len(got) != 1 || got[0].JobID != 3 || got[0].RunID != 30 || got[0].Delivery != "" || got[0].EventID() != "job-3-queued" {
		t.Fatalf("facts %+v, want one for job 3, keyed job-3-queued", got)
	}
	l.add(&got[0])
	if plan := l.add(host("h-a", 1, 1)).decide(); len(plan.Reserve) != 1 || plan.Reserve[0].JobID != 1 {
		// job 1 is older demand and the host has one slot
		t.Fatalf("reserve %+v", plan.Reserve)
	}
	if j := l.f.Jobs[3]; j == nil || !j.Demand() {
		t.Fatal("the found job is not demand")
	}
}
