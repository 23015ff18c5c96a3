package dispatch

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bradleyfalzon/ghinstallation/v2"
	"github.com/google/go-github/v62/github"
)

// Budget tracks the GitHub API budget from response headers and holds every
// call back while GitHub says to wait (BL-37: at remaining 0 no call is made
// before the reset).
//
// GitHub's rules ("Rate limits for the REST API", docs.github.com): the
// primary limit answers 403 or 429 with x-ratelimit-remaining: 0 and
// x-ratelimit-reset (Unix seconds); secondary limits answer 403 or 429,
// often with remaining not 0, sometimes with Retry-After (seconds), and
// without Retry-After the client should wait at least a minute. go-github
// v62 maps a 429, or a 403 without documentation_url, to a plain
// *ErrorResponse, so the status and headers are read here, in one place.
type Budget struct {
	mu        sync.Mutex
	remaining int
	limit     int
	reset     time.Time
	until     time.Time // no call before this
	seen      time.Time // when the headers were last read
	// GitHub refused the App's own credentials (AuthRefused): no call
	// before authUntil, a back-off that doubles with each refusal in a
	// row (authRefusals) and starts again after an answer that is not one.
	authUntil    time.Time
	authRefusals int
}

// Back-off after GitHub refuses the App's credentials: the first wait, and
// the most it grows to.
const (
	authWaitFirst = time.Second
	authWaitMax   = 2 * time.Minute
)

// secondaryWait is GitHub's advice for a secondary limit without Retry-After.
const secondaryWait = time.Minute

// ObserveAPI is Observe for a go-github call's answer, now; a nil Budget
// observes nothing.
func (b *Budget) ObserveAPI(resp *github.Response, err error) {
	if b == nil {
		return
	}
	var hr *http.Response
	if resp != nil {
		hr = resp.Response
	}
	b.Observe(hr, err, time.Now())
}

// Observe reads one response (resp may be nil on a transport error).
func (b *Budget) Observe(resp *http.Response, err error, now time.Time) {
	if resp == nil {
		var er *github.ErrorResponse
		if errors.As(err, &er) && er.Response != nil {
			resp = er.Response
		}
	}
	if resp == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if resp.StatusCode < 400 {
		b.authRefusals = 0 // GitHub takes the credentials again
	}
	h := resp.Header
	if v, err := strconv.Atoi(h.Get("X-RateLimit-Remaining")); err == nil {
		b.remaining, b.seen = v, now
	}
	if v, err := strconv.Atoi(h.Get("X-RateLimit-Limit")); err == nil {
		b.limit = v
	}
	resetGiven := false
	if v, err := strconv.ParseInt(h.Get("X-RateLimit-Reset"), 10, 64); err == nil {
		b.reset, resetGiven = time.Unix(v, 0), true
	}
	if resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusTooManyRequests {
		return
	}
	limited := resp.StatusCode == http.StatusTooManyRequests || h.Get("Retry-After") != "" ||
		h.Get("X-RateLimit-Remaining") == "0" || isSecondary(err)
	if !limited {
		return // a 403 for permissions, not for rate
	}
	wait := now.Add(secondaryWait)
	var primary *github.RateLimitError
	var abuse *github.AbuseRateLimitError
	switch ra, raErr := strconv.Atoi(h.Get("Retry-After")); {
	case errors.As(err, &primary) && !primary.Rate.Reset.Time.IsZero():
		// go-github refuses a call itself while the limit it last saw
		// holds, with a made-up 403 that carries no headers: its Rate is
		// the limit's own reset, not a secondary limit's minute.
		wait = primary.Rate.Reset.Time
	case errors.As(err, &abuse) && abuse.RetryAfter != nil:
		wait = now.Add(*abuse.RetryAfter) // typed, or go-github's own refusal
	case raErr == nil:
		wait = now.Add(time.Duration(ra) * time.Second)
	case h.Get("X-RateLimit-Remaining") == "0" && resetGiven:
		// The primary limit lifts at the reset GitHub gives, even when the
		// answer is read after it (a loaded host): then no wait at all,
		// not the secondary limit's minute.
		wait = b.reset
	}
	if wait.After(b.until) {
		b.until = wait
	}
}

// isSecondary recognises a rate-limit 403 that carries neither Retry-After
// nor remaining 0. go-github types it only when the body has a
// documentation_url; otherwise the message is all GitHub leaves ("You have
// exceeded a secondary rate limit", recorded in the shared fixtures), so it
// is matched here and nowhere else.
func isSecondary(err error) bool {
	var abuse *github.AbuseRateLimitError
	var primary *github.RateLimitError
	if errors.As(err, &abuse) || errors.As(err, &primary) {
		return true
	}
	var er *github.ErrorResponse
	return errors.As(err, &er) && strings.Contains(strings.ToLower(er.Message), "rate limit")
}

// RateLimited reports whether a failed call was refused for rate: a typed
// primary or secondary limit, a 429, or a 403 with remaining 0, Retry-After
// or the secondary-limit message (the same reading as Observe's).
func RateLimited(err error) bool {
	if isSecondary(err) {
		return true
	}
	var er *github.ErrorResponse
	if !errors.As(err, &er) || er.Response == nil {
		return false
	}
	h := er.Response.Header
	switch er.Response.StatusCode {
	case http.StatusTooManyRequests:
		return true
	case http.StatusForbidden:
		return h.Get("Retry-After") != "" || h.Get("X-RateLimit-Remaining") == "0"
	}
	return false
}

// Blocked reports whether calls must wait, and until when: for a rate
// limit, or after GitHub refused the App's credentials.
func (b *Budget) Blocked(now time.Time) (bool, time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	until := b.until
	if b.authUntil.After(until) {
		until = b.authUntil
	}
	return now.Before(until), until
}

// Refused records that GitHub refused the App's own credentials (law 11:
// GitHub's fault, not the job's): calls pause for a back-off that doubles
// with each refusal in a row, from authWaitFirst to authWaitMax.
func (b *Budget) Refused(now time.Time) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	wait := authWaitFirst
	for i := 0; i < b.authRefusals && wait < authWaitMax; i++ {
		wait *= 2
	}
	b.authRefusals++
	if until := now.Add(min(wait, authWaitMax)); until.After(b.authUntil) {
		b.authUntil = until
	}
	return b.authUntil
}

// Paused says why calls wait now ("auth": GitHub refused the App's
// credentials; "rate": a rate limit; "" when they do not), and until when.
func (b *Budget) Paused(now time.Time) (reason string, until time.Time) {
	if b == nil {
		return "", time.Time{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case now.Before(b.authUntil):
		return "auth", b.authUntil
	case now.Before(b.until):
		return "rate", b.until
	}
	return "", time.Time{}
}

// AuthRefused reports whether a failed call means GitHub refused the App's
// own credentials: a 401 from the API (a JIT-config call) or from the
// installation-token endpoint (ghinstallation's *HTTPError), or a 403 that
// is not a rate limit ("Resource not accessible by integration": the
// App's permissions). The status is read here, in one place.
func AuthRefused(err error) bool {
	var resp *http.Response
	var er *github.ErrorResponse
	var te *ghinstallation.HTTPError
	switch {
	case errors.As(err, &er):
		resp = er.Response
	case errors.As(err, &te):
		resp = te.Response
	}
	if resp == nil {
		return false
	}
	switch resp.StatusCode {
	case http.StatusUnauthorized:
		return true
	case http.StatusForbidden:
		return !RateLimited(err)
	}
	return false
}

// State is the budget as last seen, for metrics and health.
func (b *Budget) State() (remaining, limit int, reset, blockedUntil, seen time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.remaining, b.limit, b.reset, b.until, b.seen
}

// Spare reports whether an optional read may spend the REST budget: more
// than keep (a fraction, e.g. 0.25) of the limit GitHub last reported
// remains, or nothing was reported yet. Searches that only speed up a
// recovery (the scale set reconciler's) stop short of the reserve, which
// stays for JIT configs and the reads that release slots.
func (b *Budget) Spare(keep float64) bool {
	if b == nil {
		return true
	}
	remaining, limit, _, _, seen := b.State()
	return seen.IsZero() || limit <= 0 || float64(remaining) > keep*float64(limit)
}
