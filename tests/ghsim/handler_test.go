package ghsim_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/google/go-github/v62/github"

	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/tests/ghsim"
)

// The Handler can be mounted on a foreign server; JIT configs then point at it.
func TestHandlerOnForeignServer(t *testing.T) {
	rc := newReceiver(t)
	sim, err := ghsim.New(ghsim.Config{WebhookURL: rc.srv.URL, WebhookSecret: testSecret,
		Org: testOrg, Repo: testRepo, FixturesDir: fixturesDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(sim.Handler())
	t.Cleanup(func() { _ = sim.Close(); srv.Close() }) // Close first releases long-polls
	if sim.URL() != "" {
		t.Fatalf("URL() = %q before Start", sim.URL())
	}
	gh := github.NewClient(httpClient(t)).WithAuthToken("t")
	gh.BaseURL, _ = url.Parse(srv.URL + "/")
	cfg, _, err := gh.Actions.GenerateRepoJITConfig(context.Background(), testOrg, testRepo,
		&github.GenerateJITConfigRequest{Name: "foreign", RunnerGroupID: 1, Labels: []string{"self-hosted"}})
	if err != nil {
		t.Fatal(err)
	}
	jobID := sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted"}, Duration: 10 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := ghsim.RunRunner(ctx, cfg.GetEncodedJITConfig(), nil); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, waitLimit, "3 webhooks", func() bool { return len(jobEvents(t, rc, jobID)) == 3 })
	// Every payload shares one org-hook envelope: no installation, same repository.
	for _, r := range rc.all() {
		var p map[string]any
		if err := json.Unmarshal(r.body, &p); err != nil {
			t.Fatal(err)
		}
		if _, ok := p["installation"]; ok {
			t.Fatalf("%s payload has installation", p["action"])
		}
		if p["repository"].(map[string]any)["full_name"] != testOrg+"/"+testRepo {
			t.Fatalf("%s payload repository = %v", p["action"], p["repository"])
		}
	}
}
