package ghsim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Faults GitHub shows a fleet manager in the field (issue 5): deliveries it
// could not make and does not retry, and rate-limit answers in their three
// shapes.

// LoseDeliveries makes the sim fail every delivery match accepts, as GitHub
// does when the receiver is down or unreachable: the delivery is recorded as
// failed (StatusCode 0, Err "lost: …", listed in the hook's deliveries with
// status_code 0) and never retried, so only a redelivery (Redeliver, or the
// hook-deliveries API) or a reconcile can bring it. nil stops losing.
func (s *Sim) LoseDeliveries(match func(DeliveryView) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lose = match
}

// TimeOutDeliveries makes the sim send every delivery match accepts but
// record it as failed ("timed out", status_code 0), as GitHub does when the
// receiver answers after 10 s: the receiver may well have stored it. nil
// stops it.
func (s *Sim) TimeOutDeliveries(match func(DeliveryView) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.timeOut = match
}

// LoseJITAnswers makes generate-jitconfig register the runner for every
// name match accepts and then lose the answer: the connection is closed
// before a response is written, as when a client's deadline passes or a
// proxy drops it while GitHub has done the work. The runner stays
// registered (offline, listed by the runners API), and a retry with the
// same name meets 409. nil stops losing.
func (s *Sim) LoseJITAnswers(match func(name string) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loseJIT = match
}

// loseAnswer closes the connection of w without an answer; false when w
// cannot be hijacked (the caller answers 502 instead).
func loseAnswer(w http.ResponseWriter) bool {
	hj, ok := w.(http.Hijacker)
	if !ok {
		return false
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// lost reports whether d is to be lost, and records it as failed if so.
func (s *Sim) lost(d *delivery) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lose == nil || !s.lose(d.view) {
		return false
	}
	d.view.Done, d.view.StatusCode, d.view.Err = true, 0, "lost: failed to connect to host"
	d.at = time.Now().UTC()
	return true
}

// RateLimitShape is one of the ways GitHub says "slow down" ("Rate limits
// for the REST API", docs.github.com).
type RateLimitShape int

const (
	// PrimaryLimit is 403 with x-ratelimit-remaining: 0 and x-ratelimit-reset
	// at the end of the wait (shape of
	// api/error.403.primary-rate-limit.go-github-test.json).
	PrimaryLimit RateLimitShape = iota
	// SecondaryForbidden is 403 with remaining not 0, the secondary-limit
	// message without documentation_url, and Retry-After (body of
	// api/error.403.secondary-rate-limit.recorded.wiremock.json).
	SecondaryForbidden
	// TooManyRequests is 429 with Retry-After (shape of
	// api/error.429.secondary-rate-limit.recorded.wiremock.json).
	TooManyRequests
)

func (r RateLimitShape) String() string {
	return [...]string{"primary 403", "secondary 403", "429"}[r]
}

type rateLimit struct {
	shape RateLimitShape
	calls int // answers left to give this way
	wait  time.Duration
	until time.Time // with calls < 0: every answer until then
}

// RateLimit makes the next calls requests to route (a Route* name) answer
// with the rate-limit shape, telling the client to wait for wait (rounded
// up to whole seconds, as GitHub's headers are). Calls to other routes are
// served as usual. The route's APICalls count includes the refused calls,
// so a test can see whether the client waited. calls < 0 refuses every
// call for wait from now (GitHub's limit until its reset), each told to
// wait what is left of it.
func (s *Sim) RateLimit(route string, shape RateLimitShape, calls int, wait time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.limits == nil {
		s.limits = map[string]*rateLimit{}
	}
	l := &rateLimit{shape: shape, calls: calls, wait: wait}
	if calls < 0 {
		l.until = time.Now().Add(wait)
	}
	s.limits[route] = l
}

// limited answers the call with a rate-limit refusal if one is due for the
// route; the usual rate headers are already set.
func (s *Sim) limited(route string, w http.ResponseWriter) bool {
	s.mu.Lock()
	l := s.limits[route]
	if l != nil && l.calls < 0 && time.Now().Before(l.until) {
		l.wait = time.Until(l.until)
	} else if l == nil || l.calls <= 0 {
		s.mu.Unlock()
		return false
	} else {
		l.calls--
	}
	shape, wait := l.shape, l.wait
	primary, secondary := s.fx.primaryLimit, s.fx.secondaryLimit
	s.mu.Unlock()

	secs := int64((wait + time.Second - 1) / time.Second)
	h := w.Header()
	switch shape {
	case PrimaryLimit:
		h.Set("X-RateLimit-Remaining", "0")
		h.Set("X-RateLimit-Used", h.Get("X-RateLimit-Limit"))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(time.Now().Unix()+secs, 10))
		writeJSON(w, http.StatusForbidden, primary)
	case SecondaryForbidden:
		h.Set("gh-limited-by", "sim")
		h.Set("Retry-After", strconv.FormatInt(secs, 10))
		writeJSON(w, http.StatusForbidden, map[string]any{"message": secondary})
	default:
		h.Set("Retry-After", strconv.FormatInt(secs, 10))
		writeJSON(w, http.StatusTooManyRequests, map[string]any{"message": secondary})
	}
	s.log.Info("rate limited", "route", route, "shape", shape.String(), "wait", wait)
	return true
}

// loadLimitFixtures reads the rate-limit answers' bodies from the fixtures.
func loadLimitFixtures(dir string, fx *fixtures) error {
	var primary struct {
		Body map[string]any `json:"body"`
	}
	var secondary struct {
		Response struct {
			Body string `json:"body"`
		} `json:"response"`
	}
	for _, t := range []struct {
		name string
		dst  any
	}{{fxPrimaryLimit, &primary}, {fxSecondaryLimit, &secondary}} {
		raw, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(t.name)))
		if err != nil {
			return fmt.Errorf("ghsim: read fixture: %w", err)
		}
		if err := json.Unmarshal(raw, t.dst); err != nil {
			return fmt.Errorf("ghsim: parse fixture %s: %w", t.name, err)
		}
	}
	var body struct {
		Message string `json:"message"`
	}
	if err := json.Unmarshal([]byte(secondary.Response.Body), &body); err != nil || body.Message == "" || primary.Body["message"] == nil {
		return fmt.Errorf("ghsim: rate-limit fixtures lack a message")
	}
	fx.primaryLimit, fx.secondaryLimit = primary.Body, body.Message
	return nil
}

// Unauthorized makes every call to route (a Route* name, e.g.
// RouteJITConfigOrg or RouteInstallationToken) answer 401 "Bad
// credentials" for the next d, as GitHub does while it refuses an App's
// credentials (a revoked or rotated key, a suspended installation). The
// route's APICalls count includes the refused calls.
func (s *Sim) Unauthorized(route string, d time.Duration) {
	s.refuse(route, http.StatusUnauthorized, "Bad credentials", d)
}

// NotFound makes every call to route answer 404 "Not Found" for the next
// d, as GitHub does for a repository or organization the App cannot see.
func (s *Sim) NotFound(route string, d time.Duration) {
	s.refuse(route, http.StatusNotFound, "Not Found", d)
}

type refusal struct {
	until   time.Time
	status  int
	message string
}

func (s *Sim) refuse(route string, status int, message string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.unauthorized == nil {
		s.unauthorized = map[string]refusal{}
	}
	s.unauthorized[route] = refusal{time.Now().Add(d), status, message}
}

// refused answers the call as Unauthorized or NotFound made the route
// refuse, if one is due.
func (s *Sim) refused(route string, w http.ResponseWriter) bool {
	s.mu.Lock()
	r, ok := s.unauthorized[route]
	s.mu.Unlock()
	if !ok || !time.Now().Before(r.until) {
		return false
	}
	writeError(w, r.status, r.message, docsURL)
	s.log.Info("refused", "route", route, "status", r.status)
	return true
}
