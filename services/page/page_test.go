package page_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/page"
	"github.com/berth-ci/berth/services/testkit"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testkit.LeakOptions()...) }

// fold is a live fold a test changes under a lock, as the dispatcher's
// loop would between two reads.
type fold struct {
	mu sync.Mutex
	h  *testkit.HistoryBuilder
	f  *events.Fleet
}

func newFold(h *testkit.HistoryBuilder) *fold { return &fold{h: h, f: h.Fleet()} }

func (f *fold) read(ctx context.Context, fn func(*events.Fleet)) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f.f)
	return nil
}

// add folds more facts, as the log would deliver them.
func (f *fold) add(more func(*testkit.HistoryBuilder)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	more(f.h)
	f.f = f.h.Fleet()
}

// start serves a page over fl with opts, running its loop until the test
// ends.
func start(t *testing.T, fl *fold, opts page.Options) *httptest.Server {
	t.Helper()
	opts.Read = fl.read
	if opts.Now == nil {
		opts.Now = func() time.Time { return testkit.T0.Add(time.Hour) }
	}
	p, err := page.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(ctx) }()
	srv := httptest.NewServer(p.Handler())
	t.Cleanup(func() {
		cancel()
		<-done
		srv.Close()
	})
	return srv
}

func get(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// cell is the text of the <td class="name"> in pool's row of the pools
// table.
func cell(t *testing.T, html, pool, name string) string {
	t.Helper()
	row := regexp.MustCompile(`(?s)<tr data-pool="` + pool + `">(.*?)</tr>`).FindStringSubmatch(html)
	if row == nil {
		t.Fatalf("no row for pool %s in:\n%s", pool, html)
	}
	m := regexp.MustCompile(`<td class="n ` + name + `[^"]*">([^<]*)</td>`).FindStringSubmatch(row[1])
	if m == nil {
		t.Fatalf("no %s cell in pool %s's row: %s", name, pool, row[1])
	}
	return m[1]
}

// busy: host-a serves pool linux with 4 slots; job 1 runs on attempt 1,
// job 2 is booked (attempt 1, placed), job 3 waits.
func busy() *testkit.HistoryBuilder {
	return testkit.History().HostOnline("host-a", 4, 4).Running(1, "host-a").
		Queued(2).Reserved(2, 1, "host-a").Placed(2, 1, "host-a").Queued(3)
}

// Given a busy pool, when an operator opens the page, then each pool shows
// the held slots and capacity `berth status --json` prints, beside the
// attempts that account for them, and the jobs waiting and running.
func TestThePageShowsWhatStatusShows(t *testing.T) {
	fl := newFold(busy())
	srv := start(t, fl, page.Options{})
	code, html := get(t, srv.Client(), srv.URL+"/")
	if code != http.StatusOK {
		t.Fatalf("GET / = %d:\n%s", code, html)
	}
	st := fl.h.Fleet().Status()
	for _, p := range st.Pools {
		if got := cell(t, html, p.Name, "held"); got != strconv.Itoa(p.Held) {
			t.Errorf("pool %s held on the page %s, status says %d", p.Name, got, p.Held)
		}
		if got := cell(t, html, p.Name, "capacity"); got != strconv.Itoa(p.Capacity) {
			t.Errorf("pool %s capacity on the page %s, status says %d", p.Name, got, p.Capacity)
		}
		for _, h := range p.HeldBy {
			if !strings.Contains(html, "<code>"+h.Attempt+"</code>") {
				t.Errorf("held slot's attempt %s not shown", h.Attempt)
			}
		}
	}
	if st.Pools[0].Held != 2 {
		t.Fatalf("the history holds %d slots, want 2 (test setup)", st.Pools[0].Held)
	}
	for _, want := range []string{`data-job="3"`, `href="job/1"`, `data-host="host-a"`, `<svg`} {
		if !strings.Contains(html, want) {
			t.Errorf("page lacks %s", want)
		}
	}
}

// readEvent reads one server-sent event's data (its data lines joined).
func readEvent(r *bufio.Reader) (string, error) {
	var data []string
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return "", err
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case line == "" && data != nil:
			return strings.Join(data, "\n"), nil
		case strings.HasPrefix(line, "data: "):
			data = append(data, strings.TrimPrefix(line, "data: "))
		}
	}
}

// Given a browser following the page's stream, when job 1 completes and
// its slot is released, then the stream sends the pool with one slot
// fewer held within a second, without the browser asking again.
func TestAReleaseReachesTheStreamWithinASecond(t *testing.T) {
	fl := newFold(busy())
	srv := start(t, fl, page.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/live", nil)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q, want text/event-stream", ct)
	}
	evs := make(chan string, 16)
	go func() {
		defer close(evs)
		r := bufio.NewReader(resp.Body)
		for {
			ev, err := readEvent(r)
			if err != nil {
				return
			}
			evs <- ev
		}
	}()
	first := <-evs
	if got := cell(t, first, "linux", "held"); got != "2" {
		t.Fatalf("first event shows %s held, want 2", got)
	}
	released := time.Now()
	fl.add(func(h *testkit.HistoryBuilder) {
		h.Completed(1, events.AttemptID(1, 1), "success").Released(1, 1, "host-a", "completed")
	})
	deadline := time.After(time.Second)
	for {
		select {
		case ev, ok := <-evs:
			if !ok {
				t.Fatal("the stream ended")
			}
			if cell(t, ev, "linux", "held") == "1" {
				t.Logf("the release reached the stream after %s", time.Since(released).Round(time.Millisecond))
				return
			}
		case <-deadline:
			t.Fatal("the release did not reach the stream within a second")
		}
	}
}

// Given a placement whose sealed JIT config is in the fold, when the page
// and the job's timeline are rendered, then neither holds it (in clear,
// base64 or hex), nor does any page offer a form or a write.
func TestNoPageHoldsASecret(t *testing.T) {
	jit := []byte("SEALED-JIT-CONFIG-0123456789")
	h := testkit.History().HostOnline("host-a", 4, 4).Queued(7).Reserved(7, 1, "host-a").
		Add(&events.AttemptPlaced{AttemptRef: testkit.Attempt(7, 1, "host-a"), JobID: 7, Labels: testkit.Labels,
			SealedJIT: jit, SealedBy: "XDISPATCHERKEY", SealedTo: "Xhost-a"})
	fl := newFold(h)
	srv := start(t, fl, page.Options{})
	for _, path := range []string{"/", "/job/7"} {
		code, html := get(t, srv.Client(), srv.URL+path)
		if code != http.StatusOK {
			t.Fatalf("GET %s = %d", path, code)
		}
		for _, secret := range []string{string(jit), base64.StdEncoding.EncodeToString(jit), "XDISPATCHERKEY"} {
			if strings.Contains(html, secret) {
				t.Errorf("GET %s shows %q", path, secret)
			}
		}
		if strings.Contains(strings.ToLower(html), "<form") {
			t.Errorf("GET %s offers a form: the page performs no action", path)
		}
	}
}

// Given the page, when anything but GET asks (a cordon, a drain, a
// release through some other verb), then it is refused with 405.
func TestThePageIsReadOnly(t *testing.T) {
	srv := start(t, newFold(busy()), page.Options{})
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		for _, path := range []string{"/", "/live", "/job/1"} {
			req, _ := http.NewRequest(m, srv.URL+path, strings.NewReader("{}"))
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusMethodNotAllowed {
				t.Errorf("%s %s = %d, want 405", m, path, resp.StatusCode)
			}
		}
	}
}

// Given a page configured with a token and a basic-auth user, then a
// reader without either is refused; ?token= once sets a cookie that
// admits; a bearer header admits; the user's password admits; a wrong one
// does not.
func TestThePageAsksForItsTokenOrPassword(t *testing.T) {
	srv := start(t, newFold(busy()), page.Options{Auth: page.Auth{Token: "t0ken", User: "oncall", Password: "pw"}})
	c := srv.Client()
	if code, _ := get(t, c, srv.URL+"/"); code != http.StatusUnauthorized {
		t.Errorf("no credential: %d, want 401", code)
	}
	if code, _ := get(t, c, srv.URL+"/?token=wrong"); code != http.StatusUnauthorized {
		t.Errorf("wrong token: %d, want 401", code)
	}
	noFollow := *c
	noFollow.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := noFollow.Get(srv.URL + "/?token=t0ken")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || strings.Contains(resp.Header.Get("Location"), "t0ken") || len(resp.Cookies()) != 1 {
		t.Fatalf("?token=: %d to %q with cookies %v, want 303 to the page without the token, setting a cookie",
			resp.StatusCode, resp.Header.Get("Location"), resp.Cookies())
	}
	ck := resp.Cookies()[0]
	if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode {
		t.Errorf("cookie %+v, want HttpOnly and SameSite=Strict", ck)
	}
	for name, set := range map[string]func(*http.Request){
		"cookie": func(r *http.Request) { r.AddCookie(ck) },
		"bearer": func(r *http.Request) { r.Header.Set("Authorization", "Bearer t0ken") },
		"basic":  func(r *http.Request) { r.SetBasicAuth("oncall", "pw") },
	} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
		set(req)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %d, want 200", name, resp.StatusCode)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
	req.SetBasicAuth("oncall", "nope")
	resp, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
		t.Errorf("wrong password: %d (WWW-Authenticate %q), want 401 asking for basic auth", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
}

// Given a browser without script, then the page refreshes itself; with
// script, only the page's own inline script may run (its hash is the
// only one the Content-Security-Policy allows) and it fetches nothing
// from elsewhere.
func TestThePageRefreshesWithoutScriptAndRunsOnlyItsOwn(t *testing.T) {
	srv := start(t, newFold(busy()), page.Options{})
	resp, err := srv.Client().Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	html := string(b)
	if !strings.Contains(html, `<noscript><meta http-equiv="refresh" content="5"></noscript>`) {
		t.Error("no refresh without script")
	}
	m := regexp.MustCompile(`(?s)<script>(.*?)</script>`).FindAllStringSubmatch(html, -1)
	if len(m) != 1 {
		t.Fatalf("%d inline scripts, want 1", len(m))
	}
	sum := sha256.Sum256([]byte(m[0][1]))
	csp := resp.Header.Get("Content-Security-Policy")
	if !strings.Contains(csp, "script-src 'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'") || !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("CSP %q does not pin the inline script", csp)
	}
	if regexp.MustCompile(`(src|href)="(https?:)?//`).MatchString(html) {
		t.Error("the page refers to another origin")
	}
}
