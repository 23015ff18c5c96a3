package dispatch_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-ci/berth/services/dispatch"
)

// recorded is a fixture error answer: status, headers and body.
type recorded struct {
	status int
	header http.Header
	body   string
}

// loadRecorded reads a rate-limit answer from ../shared/fixtures/github/api/:
// the hub4j WireMock recordings and go-github's assembled primary-limit one.
// WireMock templates in header values are replaced by now-based values.
func loadRecorded(t *testing.T, name string, now time.Time) recorded {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "..", "shared", "fixtures", "github", "api", name))
	if err != nil {
		t.Fatal(err)
	}
	var wm struct {
		Response *struct {
			Status  int            `json:"status"`
			Body    string         `json:"body"`
			Headers map[string]any `json:"headers"`
		} `json:"response"`
		Status  int               `json:"status"`
		Headers map[string]string `json:"headers"`
		Body    json.RawMessage   `json:"body"`
	}
	if err := json.Unmarshal(b, &wm); err != nil {
		t.Fatal(err)
	}
	r := recorded{header: http.Header{}}
	if wm.Response != nil {
		r.status, r.body = wm.Response.Status, wm.Response.Body
		for k, v := range wm.Response.Headers {
			if s, ok := v.(string); ok {
				if len(s) > 2 && s[:2] == "{{" {
					if k == "X-RateLimit-Reset" {
						s = strconv.FormatInt(now.Add(30*time.Minute).Unix(), 10)
					} else {
						continue
					}
				}
				r.header.Set(k, s)
			}
		}
	} else {
		r.status, r.body = wm.Status, string(wm.Body)
		for k, v := range wm.Headers {
			r.header.Set(k, v)
		}
	}
	return r
}

// serve answers every call with r and counts the calls that reached it.
func serve(t *testing.T, r recorded) (*dispatch.GitHubMinter, *atomic.Int32) {
	t.Helper()
	calls := new(atomic.Int32)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		for k, v := range r.header {
			w.Header()[k] = v
		}
		w.WriteHeader(r.status)
		w.Write([]byte(r.body))
	}))
	t.Cleanup(srv.Close)
	gh, err := dispatch.NewGitHubClient(srv.URL, "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	return &dispatch.GitHubMinter{Client: gh, Scope: "org", Org: "example-org"}, calls
}

func mintAgainst(t *testing.T, r recorded) *dispatch.Budget {
	t.Helper()
	m, _ := serve(t, r)
	b := &dispatch.Budget{}
	m.Budget = b
	if _, _, err := m.Mint(t.Context(), dispatch.MintRequest{RunnerName: "berth-1-1", Labels: []string{"self-hosted"}}); err == nil {
		t.Fatal("a rate-limited answer minted")
	}
	return b
}

// Given GitHub's recorded rate-limit answers, the budget holds calls back
// exactly as GitHub asks (BL-37): a 429 with Retry-After 8 for 8 s; a
// secondary-limit 403 with remaining 4000 and no Retry-After for a minute;
// a primary-limit 403 with remaining 0 until x-ratelimit-reset. go-github
// v62 does not type the first two, so this is where they must be caught.
func TestRateLimitAnswersHoldCallsBackAsGitHubAsks(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		fixture string
		min     time.Duration
		max     time.Duration
	}{
		{"error.429.secondary-rate-limit.recorded.wiremock.json", 7 * time.Second, 9 * time.Second},
		{"error.403.secondary-rate-limit.recorded.wiremock.json", 59 * time.Second, 61 * time.Second},
	} {
		b := mintAgainst(t, loadRecorded(t, tc.fixture, now))
		blocked, until := b.Blocked(time.Now())
		if wait := time.Until(until); !blocked || wait < tc.min || wait > tc.max {
			t.Errorf("%s: blocked %v for %v, want between %v and %v", tc.fixture, blocked, wait, tc.min, tc.max)
		}
	}
	primary := loadRecorded(t, "error.403.primary-rate-limit.go-github-test.json", now)
	reset := now.Add(25 * time.Minute).Truncate(time.Second)
	primary.header.Set("X-RateLimit-Reset", strconv.FormatInt(reset.Unix(), 10)) // the recording's reset is in 2013
	b := mintAgainst(t, primary)
	if blocked, until := b.Blocked(time.Now()); !blocked || !until.Equal(reset) {
		t.Errorf("primary limit: blocked %v until %v, want until the reset %v", blocked, until, reset)
	}
	if rem, _, _, _, _ := b.State(); rem != 0 {
		t.Errorf("remaining %d, want 0", rem)
	}
	// Read after its reset (a loaded host is slow to look): the limit has
	// lifted, so nothing waits; it is no secondary limit of a minute.
	primary.header.Set("X-RateLimit-Reset", strconv.FormatInt(now.Add(-time.Second).Unix(), 10))
	if blocked, until := mintAgainst(t, primary).Blocked(time.Now()); blocked {
		t.Errorf("primary limit read after its reset: blocked until %v, want not blocked", until)
	}
}

// A 403 that is not about rate (missing permission) blocks nothing.
func TestAForbiddenForPermissionsIsNotARateLimit(t *testing.T) {
	b := mintAgainst(t, recorded{status: 403, header: http.Header{"X-Ratelimit-Remaining": {"4999"}},
		body: `{"message":"Resource not accessible by integration","documentation_url":"https://docs.github.com/rest"}`})
	if blocked, _ := b.Blocked(time.Now()); blocked {
		t.Error("a permissions 403 was taken for a rate limit")
	}
}

// RateLimited tells the dispatcher to give a booking back rather than count
// a failed mint: true for GitHub's three rate-limit answers (recorded), false
// for a permissions 403, a 5xx or a transport error.
func TestRateLimitedRecognisesTheThreeShapes(t *testing.T) {
	now := time.Now()
	mintErr := func(r recorded) error {
		t.Helper()
		m, _ := serve(t, r)
		_, _, err := m.Mint(t.Context(), dispatch.MintRequest{RunnerName: "berth-1-1", Labels: []string{"self-hosted"}})
		return err
	}
	primary := loadRecorded(t, "error.403.primary-rate-limit.go-github-test.json", now)
	primary.header.Set("X-RateLimit-Reset", strconv.FormatInt(now.Add(time.Minute).Unix(), 10))
	for name, c := range map[string]struct {
		r    recorded
		want bool
	}{
		"primary 403":     {primary, true},
		"secondary 403":   {loadRecorded(t, "error.403.secondary-rate-limit.recorded.wiremock.json", now), true},
		"429":             {loadRecorded(t, "error.429.secondary-rate-limit.recorded.wiremock.json", now), true},
		"permissions 403": {recorded{status: 403, header: http.Header{"X-Ratelimit-Remaining": {"4999"}}, body: `{"message":"Resource not accessible by integration"}`}, false},
		"502":             {recorded{status: 502, body: `{"message":"Server Error"}`}, false},
	} {
		if got := dispatch.RateLimited(mintErr(c.r)); got != c.want {
			t.Errorf("%s: RateLimited %v, want %v", name, got, c.want)
		}
	}
}

// Given a limit GitHub answered once, go-github refuses the next calls
// itself with a made-up 403 that has no headers (v62's
// checkRateLimitBeforeDo and checkSecondaryRateLimitBeforeDo); such a
// refusal holds calls back only until the limit GitHub gave lifts, not for
// a secondary limit's minute. (A reconcile call refused that way during a
// 3-second primary limit once held every mint back for a minute.)
func TestGoGitHubsOwnRefusalKeepsTheLimitGitHubGave(t *testing.T) {
	now := time.Now()
	primary := loadRecorded(t, "error.403.primary-rate-limit.go-github-test.json", now)
	reset := now.Add(10 * time.Second).Truncate(time.Second)
	primary.header.Set("X-RateLimit-Reset", strconv.FormatInt(reset.Unix(), 10))
	for name, r := range map[string]recorded{
		"primary 403": primary,
		// Typed by go-github (documentation_url), which then keeps it.
		"secondary 403 with Retry-After": {status: 403, header: http.Header{"Retry-After": {"8"}},
			body: `{"message":"You have exceeded a secondary rate limit.","documentation_url":"https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits"}`},
	} {
		t.Run(name, func(t *testing.T) {
			m, calls := serve(t, r)
			b := &dispatch.Budget{}
			m.Budget = b
			req := dispatch.MintRequest{RunnerName: "berth-1-1", Labels: []string{"self-hosted"}}
			if _, _, err := m.Mint(t.Context(), req); err == nil {
				t.Fatal("a rate-limited answer minted")
			}
			_, given := b.Blocked(time.Now())
			if _, _, err := m.Mint(t.Context(), req); err == nil {
				t.Fatal("minted while go-github holds the limit")
			}
			if n := calls.Load(); n != 1 {
				t.Fatalf("%d calls reached GitHub, want 1 (the second refused by go-github itself)", n)
			}
			_, until := b.Blocked(time.Now())
			if d := until.Sub(given); d > time.Second || d < -time.Second {
				t.Errorf("after go-github's own refusal calls wait until %v, want the %v GitHub gave", until.Format(time.RFC3339), given.Format(time.RFC3339))
			}
		})
	}
}

// Given the budget GitHub's headers report, an optional search may spend
// it only while more than the kept quarter remains; before any answer it
// may (nothing says otherwise).
func TestSpareKeepsAQuarterOfTheBudget(t *testing.T) {
	b := &dispatch.Budget{}
	if !b.Spare(0.25) {
		t.Fatal("no answer seen yet: a search may run")
	}
	for _, c := range []struct {
		remaining string
		want      bool
	}{{"4000", true}, {"1251", true}, {"1250", false}, {"0", false}} {
		h := http.Header{}
		h.Set("X-RateLimit-Limit", "5000")
		h.Set("X-RateLimit-Remaining", c.remaining)
		b.Observe(&http.Response{StatusCode: http.StatusOK, Header: h}, nil, time.Now())
		if got := b.Spare(0.25); got != c.want {
			t.Errorf("remaining %s of 5000: Spare %v, want %v", c.remaining, got, c.want)
		}
	}
}
