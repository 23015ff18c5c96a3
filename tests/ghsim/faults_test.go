package ghsim_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-github/v62/github"

	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/tests/ghsim"
)

// A lost delivery never reaches the receiver and is listed as failed by the
// three hook-deliveries endpoints (App, organization, repository), decoded
// with go-github; redelivering it through the API sends it again with the
// same X-GitHub-Delivery, and the redelivery is a row of its own.
func TestLostDeliveryIsListedAndRedeliveredThroughTheAPI(t *testing.T) {
	sim, rc := newSim(t)
	sim.LoseDeliveries(func(d ghsim.DeliveryView) bool { return !d.Redelivery })
	id := sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted"}})
	testkit.Eventually(t, waitLimit, "lost delivery recorded", func() bool { d := sim.Deliveries(); return len(d) == 1 && d[0].Done })
	lost := sim.Deliveries()[0]
	if lost.StatusCode != 0 || lost.Err == "" || len(rc.all()) != 0 {
		t.Fatalf("lost delivery %+v, receiver saw %d", lost, len(rc.all()))
	}

	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	gh := ghClient(t, sim, "t")
	app, _, err := gh.Apps.ListHookDeliveries(ctx, &github.ListCursorOptions{PerPage: 10})
	if err != nil {
		t.Fatal(err)
	}
	org, _, err := gh.Organizations.ListHookDeliveries(ctx, testOrg, sim.HookID(), nil)
	if err != nil {
		t.Fatal(err)
	}
	repo, _, err := gh.Repositories.ListHookDeliveries(ctx, testOrg, testRepo, sim.HookID(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, rows := range map[string][]*github.HookDelivery{"app": app, "org": org, "repo": repo} {
		if len(rows) != 1 {
			t.Fatalf("%s hook: %d rows, want 1", name, len(rows))
		}
		r := rows[0]
		if r.GetGUID() != lost.ID || r.GetStatusCode() != 0 || r.GetEvent() != "workflow_job" || r.GetAction() != "queued" ||
			r.GetRedelivery() || r.GetID() == 0 || r.GetDeliveredAt().IsZero() || r.GetStatus() == "OK" {
			t.Fatalf("%s hook row %v", name, r)
		}
	}
	if _, _, err := gh.Organizations.ListHookDeliveries(ctx, testOrg, sim.HookID()+1, nil); err == nil {
		t.Fatal("another hook's deliveries listed")
	}

	_, _, err = gh.Apps.RedeliverHookDelivery(ctx, app[0].GetID())
	var accepted *github.AcceptedError
	if !errors.As(err, &accepted) {
		t.Fatalf("redeliver: %v, want 202 Accepted", err)
	}
	testkit.Eventually(t, waitLimit, "redelivery received", func() bool { return len(rc.all()) == 1 })
	if got := rc.all()[0]; got.delivery != lost.ID || got.sigErr != nil {
		t.Fatalf("redelivery %q (signature %v), want %q", got.delivery, got.sigErr, lost.ID)
	}
	testkit.Eventually(t, waitLimit, "redelivery listed", func() bool {
		rows, _, err := gh.Apps.ListHookDeliveries(ctx, nil)
		return err == nil && len(rows) == 2 && rows[0].GetRedelivery() && rows[0].GetStatusCode() == 200 && rows[0].GetGUID() == lost.ID
	})
	if _, _, err := gh.Apps.RedeliverHookDelivery(ctx, 1); err == nil || errors.As(err, &accepted) {
		t.Fatalf("unknown attempt redelivered: %v", err)
	}
	if j := job(t, sim, id); j.Status != ghsim.StatusQueued {
		t.Fatalf("job %+v", j)
	}
}

// The deliveries list pages newest first with a cursor in the Link header,
// which go-github reads into Response.Cursor.
func TestHookDeliveriesPageWithACursor(t *testing.T) {
	sim, _ := newSim(t)
	for range 5 {
		sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted"}})
	}
	testkit.Eventually(t, waitLimit, "5 deliveries", func() bool {
		n := 0
		for _, d := range sim.Deliveries() {
			if d.Done {
				n++
			}
		}
		return n == 5
	})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	gh := ghClient(t, sim, "t")
	opts := &github.ListCursorOptions{PerPage: 2}
	var seen []int64
	for page := 0; page < 5; page++ {
		rows, resp, err := gh.Apps.ListHookDeliveries(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			seen = append(seen, r.GetID())
		}
		if resp.Cursor == "" {
			break
		}
		opts.Cursor = resp.Cursor
	}
	if len(seen) != 5 {
		t.Fatalf("paged through %d rows, want 5: %v", len(seen), seen)
	}
	for i := 1; i < len(seen); i++ {
		if seen[i] >= seen[i-1] {
			t.Fatalf("not newest first: %v", seen)
		}
	}
}

// Each rate-limit shape is given for the calls asked, on the route asked,
// as GitHub gives it; then the route serves again.
func TestRateLimitShapes(t *testing.T) {
	sim, _ := newSim(t)
	hc := httpClient(t)
	post := func() *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, sim.URL()+"/orgs/"+testOrg+"/actions/runners/generate-jitconfig",
			strings.NewReader(`{"name":"r","runner_group_id":1,"labels":["self-hosted"]}`))
		req.Header.Set("Authorization", "Bearer t")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for _, c := range []struct {
		shape     ghsim.RateLimitShape
		code      int
		remaining bool // X-RateLimit-Remaining is 0
		retry     bool // Retry-After is set
	}{
		{ghsim.PrimaryLimit, 403, true, false},
		{ghsim.SecondaryForbidden, 403, false, true},
		{ghsim.TooManyRequests, 429, false, true},
	} {
		sim.RateLimit(ghsim.RouteJITConfigOrg, c.shape, 1, 1500*time.Millisecond)
		resp := post()
		h := resp.Header
		if resp.StatusCode != c.code || (h.Get("X-RateLimit-Remaining") == "0") != c.remaining || (h.Get("Retry-After") == "2") != c.retry {
			t.Fatalf("%v: %d remaining %q retry-after %q", c.shape, resp.StatusCode, h.Get("X-RateLimit-Remaining"), h.Get("Retry-After"))
		}
		if c.shape == ghsim.PrimaryLimit {
			reset, _ := strconv.ParseInt(h.Get("X-RateLimit-Reset"), 10, 64)
			if d := time.Until(time.Unix(reset, 0)); d <= 0 || d > 3*time.Second {
				t.Fatalf("primary reset in %v", d)
			}
		}
		if resp := post(); resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusConflict {
			t.Fatalf("%v: after the limit %d", c.shape, resp.StatusCode)
		}
	}
}
