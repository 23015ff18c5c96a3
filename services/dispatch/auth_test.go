package dispatch_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/berth-ci/berth/services/dispatch"
	"github.com/bradleyfalzon/ghinstallation/v2"
)

// Law 11: which GitHub answers are a refusal of the App's own credentials
// (GitHub's fault: pause, keep the job) and which are not.
func TestAuthRefusedClassifiesGitHubAnswers(t *testing.T) {
	for _, c := range []struct {
		status int
		header map[string]string
		body   string
		want   bool
	}{
		{401, nil, `{"message":"Bad credentials"}`, true},
		{403, nil, `{"message":"Resource not accessible by integration"}`, true},
		{403, map[string]string{"X-RateLimit-Remaining": "0"}, `{"message":"API rate limit exceeded"}`, false},
		{403, map[string]string{"Retry-After": "5"}, `{"message":"You have exceeded a secondary rate limit"}`, false},
		{404, nil, `{"message":"Not Found"}`, false},
		{422, nil, `{"message":"Validation Failed"}`, false},
		{500, nil, `{"message":"boom"}`, false},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			for k, v := range c.header {
				w.Header().Set(k, v)
			}
			w.WriteHeader(c.status)
			w.Write([]byte(c.body))
		}))
		gh, _ := dispatch.NewGitHubClient(srv.URL, "t", nil)
		m := &dispatch.GitHubMinter{Client: gh, Scope: "org", Org: "example-org"}
		_, _, err := m.Mint(t.Context(), dispatch.MintRequest{RunnerName: "berth-1-1", Labels: []string{"x"}})
		srv.Close()
		if got := dispatch.AuthRefused(err); got != c.want {
			t.Errorf("%d %s: auth refused %v, want %v (%v)", c.status, c.body, got, c.want, err)
		}
	}
	// The installation-token endpoint refusing: ghinstallation's own error.
	token := &ghinstallation.HTTPError{Message: "received non 2xx response status", Response: &http.Response{StatusCode: 401}}
	if !dispatch.AuthRefused(token) {
		t.Error("a 401 from the installation-token endpoint is not read as a refusal of the credentials")
	}
}

// Each refusal in a row doubles the pause, up to its cap; an answer that
// is not a refusal starts the back-off again; Paused names the reason.
func TestBudgetPausesWithABackOffAfterCredentialRefusals(t *testing.T) {
	b := &dispatch.Budget{}
	now := time.Unix(1_700_000_000, 0)
	var waits []time.Duration
	for range 10 {
		waits = append(waits, b.Refused(now).Sub(now))
		now = now.Add(5 * time.Minute) // each pause is over before the next refusal
	}
	want := []time.Duration{1, 2, 4, 8, 16, 32, 64, 120, 120, 120}
	for i := range want {
		if waits[i] != want[i]*time.Second {
			t.Fatalf("waits %v, want %v seconds", waits, want)
		}
	}
	until := b.Refused(now)
	if reason, u := b.Paused(now); reason != "auth" || !u.Equal(until) {
		t.Fatalf("paused %q until %v, want auth until %v", reason, u, until)
	}
	if blocked, _ := b.Blocked(now); !blocked {
		t.Fatal("not blocked while GitHub refuses the credentials")
	}
	b.Observe(&http.Response{StatusCode: 201, Header: http.Header{}}, nil, now)
	later := until.Add(time.Second)
	if reason, _ := b.Paused(later); reason != "" {
		t.Fatalf("paused %q after the pause is over", reason)
	}
	if w := b.Refused(later).Sub(later); w != time.Second {
		t.Fatalf("after an accepted call the next refusal waits %v, want 1s", w)
	}
}
