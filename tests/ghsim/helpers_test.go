package ghsim_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-github/v62/github"
	"go.uber.org/goleak"

	"github.com/berth-ci/berth/tests/ghsim"
)

const (
	testOrg    = "example-org"
	testRepo   = "example-repo"
	testSecret = "It's a Secret to Everybody"
	waitLimit  = 10 * time.Second
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixturesDir walks up from the working directory to the repo root (the dir
// holding go.work) and returns ../shared/fixtures/github from there.
func fixturesDir(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return filepath.Join(dir, "..", "shared", "fixtures", "github")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.work not found above the working directory")
		}
		dir = parent
	}
}

// received is one webhook as seen by the test receiver.
type received struct {
	delivery, event, userAgent, hookID string
	body                               []byte
	sigErr                             error // from github.ValidatePayload
}

// receiver is a webhook endpoint that validates signatures with go-github.
type receiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	got    []received
	status int
}

func newReceiver(t *testing.T) *receiver {
	t.Helper()
	rc := &receiver{status: http.StatusOK}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := github.ValidatePayload(r, []byte(testSecret))
		if err != nil {
			body = nil
		}
		rc.mu.Lock()
		rc.got = append(rc.got, received{
			delivery: r.Header.Get("X-GitHub-Delivery"), event: github.WebHookType(r),
			userAgent: r.UserAgent(), hookID: r.Header.Get("X-GitHub-Hook-ID"), body: body, sigErr: err,
		})
		code := rc.status
		rc.mu.Unlock()
		w.WriteHeader(code)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) all() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]received(nil), rc.got...)
}

func (rc *receiver) setStatus(code int) {
	rc.mu.Lock()
	rc.status = code
	rc.mu.Unlock()
}

// newSim starts a sim posting to a fresh receiver; both are closed at cleanup.
func newSim(t *testing.T, mod ...func(*ghsim.Config)) (*ghsim.Sim, *receiver) {
	t.Helper()
	rc := newReceiver(t)
	cfg := ghsim.Config{WebhookURL: rc.srv.URL + "/webhook", WebhookSecret: testSecret,
		Org: testOrg, Repo: testRepo, FixturesDir: fixturesDir(t)}
	for _, f := range mod {
		f(&cfg)
	}
	sim, err := ghsim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sim.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	if _, err := sim.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	return sim, rc
}

// httpClient returns a client with its own transport, closed at cleanup so no
// keep-alive goroutines outlive the test.
func httpClient(t *testing.T) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// ghClient is go-github pointed at the sim (no /api/v3 prefix).
func ghClient(t *testing.T, sim *ghsim.Sim, token string) *github.Client {
	t.Helper()
	c := github.NewClient(httpClient(t)).WithAuthToken(token)
	u, err := url.Parse(sim.URL() + "/")
	if err != nil {
		t.Fatal(err)
	}
	c.BaseURL = u
	return c
}

// mint registers an org JIT runner and returns its id and encoded config.
func mint(t *testing.T, sim *ghsim.Sim, name string, labels ...string) (int64, string) {
	t.Helper()
	cfg, _, err := ghClient(t, sim, "t").Actions.GenerateOrgJITConfig(context.Background(), testOrg,
		&github.GenerateJITConfigRequest{Name: name, RunnerGroupID: 1, Labels: labels})
	if err != nil {
		t.Fatalf("GenerateOrgJITConfig(%s): %v", name, err)
	}
	return cfg.GetRunner().GetID(), cfg.GetEncodedJITConfig()
}

// simPost posts a runner-protocol request and decodes a 200 answer into out.
func simPost(t *testing.T, ctx context.Context, sim *ghsim.Sim, path string, in, out any) (int, error) {
	return postWith(ctx, httpClient(t), sim.URL()+path, in, out)
}

// acquire performs one acquire long-poll with the token from an encoded config.
func acquire(t *testing.T, ctx context.Context, sim *ghsim.Sim, encoded string) (int, ghsim.AcquireResponse) {
	t.Helper()
	cfg, err := ghsim.DecodeJITConfig(encoded)
	if err != nil {
		t.Fatal(err)
	}
	var out ghsim.AcquireResponse
	code, err := simPost(t, ctx, sim, ghsim.AcquirePath, ghsim.AcquireRequest{Token: cfg.Token}, &out)
	if err != nil && ctx.Err() == nil {
		t.Fatalf("acquire: %v", err)
	}
	return code, out
}

func complete(t *testing.T, sim *ghsim.Sim, encoded string, jobID int64) int {
	t.Helper()
	cfg, err := ghsim.DecodeJITConfig(encoded)
	if err != nil {
		t.Fatal(err)
	}
	code, err := simPost(t, context.Background(), sim, ghsim.CompletePath,
		ghsim.CompleteRequest{Token: cfg.Token, JobID: jobID}, nil)
	if err != nil {
		t.Fatalf("complete: %v", err)
	}
	return code
}

func job(t *testing.T, sim *ghsim.Sim, id int64) ghsim.JobView {
	t.Helper()
	for _, j := range sim.Jobs() {
		if j.ID == id {
			return j
		}
	}
	t.Fatalf("job %d not found", id)
	return ghsim.JobView{}
}

// jobEvents parses every received webhook for jobID, in arrival order.
func jobEvents(t *testing.T, rc *receiver, jobID int64) []*github.WorkflowJobEvent {
	t.Helper()
	var out []*github.WorkflowJobEvent
	for _, r := range rc.all() {
		if r.sigErr != nil {
			t.Fatalf("delivery %s: signature: %v", r.delivery, r.sigErr)
		}
		ev, err := github.ParseWebHook(r.event, r.body)
		if err != nil {
			t.Fatalf("ParseWebHook(%s): %v", r.event, err)
		}
		wj, ok := ev.(*github.WorkflowJobEvent)
		if !ok {
			t.Fatalf("ParseWebHook gave %T", ev)
		}
		if wj.GetWorkflowJob().GetID() == jobID {
			out = append(out, wj)
		}
	}
	return out
}

// postWith posts JSON with the given client and decodes a 200 answer into out.
func postWith(ctx context.Context, client *http.Client, url string, in, out any) (int, error) {
	body, _ := json.Marshal(in)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK && out != nil {
		return resp.StatusCode, json.Unmarshal(raw, out)
	}
	return resp.StatusCode, nil
}
