package ghsim_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-github/v62/github"

	"github.com/berth-ci/berth/tests/ghsim"
)

func TestNewRequiresFixtures(t *testing.T) {
	_, err := ghsim.New(ghsim.Config{Org: testOrg, Repo: testRepo, FixturesDir: t.TempDir()})
	if err == nil {
		t.Fatal("New with an empty fixtures dir succeeded")
	}
}

func TestRunnersEndpointsDecodeWithGoGitHub(t *testing.T) {
	sim, _ := newSim(t)
	ctx := context.Background()
	gh := ghClient(t, sim, "t")

	cfg, resp, err := gh.Actions.GenerateOrgJITConfig(ctx, testOrg, &github.GenerateJITConfigRequest{
		Name: "org-1", RunnerGroupID: 1, Labels: []string{"self-hosted", "linux", "berth"}, WorkFolder: github.String("_w")})
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("GenerateOrgJITConfig: %v %v", resp, err)
	}
	r := cfg.GetRunner()
	if r.GetID() == 0 || r.GetName() != "org-1" || r.GetStatus() != "offline" || r.GetBusy() || r.GetOS() != "linux" ||
		len(r.Labels) != 3 || r.Labels[2].GetName() != "berth" || r.Labels[2].GetType() != "custom" || r.Labels[0].GetType() != "read-only" {
		t.Fatalf("runner = %+v", r)
	}
	dec, err := ghsim.DecodeJITConfig(cfg.GetEncodedJITConfig())
	if err != nil || dec.RunnerID != r.GetID() || dec.RunnerName != "org-1" || dec.SimURL != sim.URL() || dec.WorkFolder != "_w" || dec.Token == "" {
		t.Fatalf("decoded jit config = %+v, %v", dec, err)
	}
	if _, _, err := gh.Actions.GenerateOrgJITConfig(ctx, testOrg, &github.GenerateJITConfigRequest{
		Name: "org-2", RunnerGroupID: 1, Labels: []string{"self-hosted"}}); err != nil {
		t.Fatal(err)
	}
	repoCfg, resp, err := gh.Actions.GenerateRepoJITConfig(ctx, testOrg, testRepo, &github.GenerateJITConfigRequest{
		Name: "repo-1", RunnerGroupID: 1, Labels: []string{"self-hosted"}})
	if err != nil || resp.StatusCode != http.StatusCreated || repoCfg.GetRunner().GetName() != "repo-1" {
		t.Fatalf("GenerateRepoJITConfig: %v %v", repoCfg, err)
	}

	// Paginated org list: per_page=1 yields two pages.
	list, resp, err := gh.Actions.ListOrganizationRunners(ctx, testOrg, &github.ListRunnersOptions{ListOptions: github.ListOptions{PerPage: 1}})
	if err != nil || list.TotalCount != 2 || len(list.Runners) != 1 || list.Runners[0].GetName() != "org-1" || resp.NextPage != 2 {
		t.Fatalf("ListOrganizationRunners page 1: %+v next=%d %v", list, resp.NextPage, err)
	}
	if resp.Rate.Limit == 0 || resp.Rate.Remaining == 0 || resp.Rate.Reset.IsZero() {
		t.Fatalf("rate headers not parsed: %+v", resp.Rate)
	}
	list, resp, err = gh.Actions.ListOrganizationRunners(ctx, testOrg, &github.ListRunnersOptions{ListOptions: github.ListOptions{PerPage: 1, Page: 2}})
	if err != nil || len(list.Runners) != 1 || list.Runners[0].GetName() != "org-2" || resp.NextPage != 0 {
		t.Fatalf("ListOrganizationRunners page 2: %+v %v", list, err)
	}
	list, _, err = gh.Actions.ListOrganizationRunners(ctx, testOrg, &github.ListRunnersOptions{Name: github.String("org-2")})
	if err != nil || list.TotalCount != 1 || list.Runners[0].GetName() != "org-2" {
		t.Fatalf("ListOrganizationRunners(name): %+v %v", list, err)
	}
	repoList, _, err := gh.Actions.ListRunners(ctx, testOrg, testRepo, nil)
	if err != nil || repoList.TotalCount != 1 || repoList.Runners[0].GetName() != "repo-1" {
		t.Fatalf("ListRunners(repo): %+v %v", repoList, err)
	}

	got, _, err := gh.Actions.GetOrganizationRunner(ctx, testOrg, r.GetID())
	if err != nil || got.GetName() != "org-1" || got.GetStatus() != "offline" {
		t.Fatalf("GetOrganizationRunner: %+v %v", got, err)
	}
	if _, resp, err := gh.Actions.GetRunner(ctx, testOrg, testRepo, r.GetID()); err == nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("org runner via repo route: %v", err)
	}
	if resp, err := gh.Actions.RemoveOrganizationRunner(ctx, testOrg, r.GetID()); err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("RemoveOrganizationRunner: %v", err)
	}
	if _, resp, err := gh.Actions.GetOrganizationRunner(ctx, testOrg, r.GetID()); err == nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("get after delete: %v", err)
	}
	if resp, err := gh.Actions.RemoveRunner(ctx, testOrg, testRepo, repoCfg.GetRunner().GetID()); err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("RemoveRunner: %v", err)
	}
}

func TestJITNameCollision409(t *testing.T) {
	sim, _ := newSim(t)
	mint(t, sim, "dup", "self-hosted")
	_, resp, err := ghClient(t, sim, "t").Actions.GenerateOrgJITConfig(context.Background(), testOrg,
		&github.GenerateJITConfigRequest{Name: "dup", RunnerGroupID: 1, Labels: []string{"self-hosted"}})
	var er *github.ErrorResponse
	if !errors.As(err, &er) || resp.StatusCode != http.StatusConflict ||
		er.Message != "Already exists - A runner with the name dup already exists." || er.DocumentationURL == "" {
		t.Fatalf("collision: %v", err)
	}
	_, resp, err = ghClient(t, sim, "t").Actions.GenerateOrgJITConfig(context.Background(), testOrg,
		&github.GenerateJITConfigRequest{Name: "no-labels", RunnerGroupID: 1})
	if err == nil || resp.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("missing labels: %v", err)
	}
}

func TestDeleteRunnerBusy422AndUnknown404(t *testing.T) {
	sim, _ := newSim(t)
	ctx := context.Background()
	gh := ghClient(t, sim, "t")
	jobID := sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted"}})
	id, enc := mint(t, sim, "busy-runner", "self-hosted")
	if code, _ := acquire(t, ctx, sim, enc); code != http.StatusOK {
		t.Fatalf("acquire = %d", code)
	}
	got, _, err := gh.Actions.GetOrganizationRunner(ctx, testOrg, id)
	if err != nil || got.GetStatus() != "online" || !got.GetBusy() {
		t.Fatalf("busy runner = %+v %v", got, err)
	}
	resp, err := gh.Actions.RemoveOrganizationRunner(ctx, testOrg, id)
	var er *github.ErrorResponse
	if !errors.As(err, &er) || resp.StatusCode != http.StatusUnprocessableEntity ||
		er.Message != `Bad request - Runner "busy-runner" is still running a job` {
		t.Fatalf("delete busy: %v", err)
	}
	if resp, err := gh.Actions.RemoveOrganizationRunner(ctx, testOrg, 987654); err == nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("delete unknown: %v", err)
	}
	if code := complete(t, sim, enc, jobID); code != http.StatusOK {
		t.Fatalf("complete = %d", code)
	}
	if resp, err := gh.Actions.RemoveOrganizationRunner(ctx, testOrg, id); err == nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("delete after ephemeral completion: %v", err)
	}
}

func TestActionsEndpointsDecodeWithGoGitHub(t *testing.T) {
	sim, _ := newSim(t)
	ctx := context.Background()
	gh := ghClient(t, sim, "t")
	done := sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted", "arm64"}})
	sim.Cancel(done)
	jobID := sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted", "linux"}, Name: "test"})
	runID := job(t, sim, jobID).RunID

	wj, _, err := gh.Actions.GetWorkflowJobByID(ctx, testOrg, testRepo, jobID)
	if err != nil || wj.GetID() != jobID || wj.GetRunID() != runID || wj.GetStatus() != "queued" || wj.Conclusion != nil ||
		wj.GetName() != "test" || len(wj.Labels) != 2 || wj.RunnerName != nil || wj.RunnerID != nil || wj.GetCreatedAt().IsZero() {
		t.Fatalf("GetWorkflowJobByID: %+v %v", wj, err)
	}
	cj, _, err := gh.Actions.GetWorkflowJobByID(ctx, testOrg, testRepo, done)
	if err != nil || cj.GetStatus() != "completed" || cj.GetConclusion() != "cancelled" || cj.RunnerName == nil || cj.GetRunnerName() != "" {
		t.Fatalf("cancelled job: %+v %v", cj, err)
	}
	if _, resp, err := gh.Actions.GetWorkflowJobByID(ctx, testOrg, testRepo, 1); err == nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown job: %v", err)
	}

	runs, _, err := gh.Actions.ListRepositoryWorkflowRuns(ctx, testOrg, testRepo, &github.ListWorkflowRunsOptions{Status: "queued"})
	if err != nil || runs.GetTotalCount() != 1 || runs.WorkflowRuns[0].GetID() != runID || runs.WorkflowRuns[0].GetStatus() != "queued" ||
		runs.WorkflowRuns[0].GetRepository().GetFullName() != testOrg+"/"+testRepo {
		t.Fatalf("ListRepositoryWorkflowRuns(queued): %+v %v", runs, err)
	}
	all, _, err := gh.Actions.ListRepositoryWorkflowRuns(ctx, testOrg, testRepo, nil)
	if err != nil || all.GetTotalCount() != 2 || all.WorkflowRuns[0].GetID() != runID {
		t.Fatalf("ListRepositoryWorkflowRuns(all, newest first): %+v %v", all, err)
	}

	jobs, _, err := gh.Actions.ListWorkflowJobs(ctx, testOrg, testRepo, runID, nil)
	if err != nil || jobs.GetTotalCount() != 1 || jobs.Jobs[0].GetID() != jobID || jobs.Jobs[0].GetStatus() != "queued" {
		t.Fatalf("ListWorkflowJobs: %+v %v", jobs, err)
	}
	if _, resp, err := gh.Actions.ListWorkflowJobs(ctx, testOrg, testRepo, 42, nil); err == nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("jobs of unknown run: %v", err)
	}
}

func TestAppTokenAndRateLimit(t *testing.T) {
	sim, _ := newSim(t)
	ctx := context.Background()
	app := ghClient(t, sim, "eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiIxMjMifQ.c2ln")
	tok, resp, err := app.Apps.CreateInstallationToken(ctx, 42, nil)
	if err != nil || resp.StatusCode != http.StatusCreated || !strings.HasPrefix(tok.GetToken(), "ghs_") ||
		time.Until(tok.GetExpiresAt().Time) < 59*time.Minute || tok.GetPermissions().GetContents() != "read" {
		t.Fatalf("CreateInstallationToken: %+v %v", tok, err)
	}
	lim, _, err := ghClient(t, sim, tok.GetToken()).RateLimit.Get(ctx)
	if err != nil || lim.GetCore().Limit != 15000 || lim.GetCore().Remaining >= 15000 ||
		lim.GetActionsRunnerRegistration().Limit == 0 || time.Until(lim.GetCore().Reset.Time) <= 0 {
		t.Fatalf("RateLimit.Get: %+v %v", lim, err)
	}
	if calls := sim.APICalls(); calls[ghsim.RouteInstallationToken] != 1 || calls[ghsim.RouteRateLimit] != 1 {
		t.Fatalf("APICalls = %v", calls)
	}
}

func TestAuthAndUnknownRoutes(t *testing.T) {
	sim, _ := newSim(t)
	client := httpClient(t)
	cases := []struct {
		method, path, auth string
		code               int
		msg                string
	}{
		{"GET", "/orgs/" + testOrg + "/actions/runners", "", 401, "Requires authentication"},
		{"GET", "/orgs/" + testOrg + "/actions/runners", "Basic Zm9vOmJhcg==", 401, "Bad credentials"},
		{"GET", "/orgs/" + testOrg + "/actions/runners", "token abc", 200, ""},
		{"GET", "/orgs/" + testOrg + "/actions/runners", "Bearer abc", 200, ""},
		{"GET", "/orgs/other-org/actions/runners", "Bearer abc", 404, "Not Found"},
		{"GET", "/repos/" + testOrg + "/other-repo/actions/runs", "Bearer abc", 404, "Not Found"},
		{"GET", "/api/v3/orgs/" + testOrg + "/actions/runners", "Bearer abc", 404, "Not Found"},
		{"GET", "/nope", "", 404, "Not Found"},
		{"PUT", "/rate_limit", "Bearer abc", 404, "Not Found"},
	}
	for _, c := range cases {
		req, _ := http.NewRequest(c.method, sim.URL()+c.path, nil)
		if c.auth != "" {
			req.Header.Set("Authorization", c.auth)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct{ Message string }
		_ = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != c.code || (c.msg != "" && body.Message != c.msg) {
			t.Errorf("%s %s auth=%q: %d %q, want %d %q", c.method, c.path, c.auth, resp.StatusCode, body.Message, c.code, c.msg)
		}
		for _, h := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "X-RateLimit-Used", "X-RateLimit-Resource"} {
			if resp.Header.Get(h) == "" {
				t.Errorf("%s %s: missing %s", c.method, c.path, h)
			}
		}
	}
	if n := sim.APICalls()[ghsim.RouteNotFound]; n != 3 {
		t.Errorf("not-found calls = %d, want 3", n)
	}
}
