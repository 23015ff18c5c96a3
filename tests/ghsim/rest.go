package ghsim

import (
	"cmp"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Route names counted by APICalls, one per REST or runner-protocol route.
const (
	RouteJITConfigOrg       = "generate-jitconfig-org"    // POST /orgs/{org}/actions/runners/generate-jitconfig
	RouteJITConfigRepo      = "generate-jitconfig-repo"   // POST /repos/{owner}/{repo}/actions/runners/generate-jitconfig
	RouteListRunnersOrg     = "list-runners-org"          // GET /orgs/{org}/actions/runners
	RouteListRunnersRepo    = "list-runners-repo"         // GET /repos/{owner}/{repo}/actions/runners
	RouteGetRunnerOrg       = "get-runner-org"            // GET /orgs/{org}/actions/runners/{runner_id}
	RouteGetRunnerRepo      = "get-runner-repo"           // GET /repos/{owner}/{repo}/actions/runners/{runner_id}
	RouteDeleteRunnerOrg    = "delete-runner-org"         // DELETE /orgs/{org}/actions/runners/{runner_id}
	RouteDeleteRunnerRepo   = "delete-runner-repo"        // DELETE /repos/{owner}/{repo}/actions/runners/{runner_id}
	RouteGetJob             = "get-job"                   // GET /repos/{owner}/{repo}/actions/jobs/{job_id}
	RouteListRuns           = "list-runs"                 // GET /repos/{owner}/{repo}/actions/runs
	RouteListRunJobs        = "list-run-jobs"             // GET /repos/{owner}/{repo}/actions/runs/{run_id}/jobs
	RouteInstallationToken  = "create-installation-token" // POST /app/installations/{installation_id}/access_tokens
	RouteRateLimit          = "rate-limit"                // GET /rate_limit
	RouteHookDeliveriesApp  = "list-hook-deliveries-app"  // GET /app/hook/deliveries
	RouteHookDeliveriesOrg  = "list-hook-deliveries-org"  // GET /orgs/{org}/hooks/{hook_id}/deliveries
	RouteHookDeliveriesRepo = "list-hook-deliveries-repo" // GET /repos/{owner}/{repo}/hooks/{hook_id}/deliveries
	RouteRedeliverApp       = "redeliver-app"             // POST /app/hook/deliveries/{delivery_id}/attempts
	RouteRedeliverOrg       = "redeliver-org"             // POST /orgs/{org}/hooks/{hook_id}/deliveries/{delivery_id}/attempts
	RouteRedeliverRepo      = "redeliver-repo"            // POST /repos/{owner}/{repo}/hooks/{hook_id}/deliveries/{delivery_id}/attempts
	RouteRunnerAcquire      = "runner-acquire"            // POST /_sim/runner/acquire
	RouteRunnerComplete     = "runner-complete"           // POST /_sim/runner/complete
	RouteNotFound           = "not-found"                 // anything else
	rateLimitPerHour        = 15000                       // a GitHub App installation's core limit
	docsURL                 = "https://docs.github.com/rest"
	docsSelfHostedRunnerURL = "https://docs.github.com/rest/actions/self-hosted-runners"
)

// APICalls returns how many requests each route received, keyed by the Route*
// constants (unauthenticated and failed requests included).
func (s *Sim) APICalls() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.apiCalls))
	for k, v := range s.apiCalls {
		out[k] = v
	}
	return out
}

func (s *Sim) routes() http.Handler {
	mux := http.NewServeMux()
	rest := func(name, pattern string, h http.HandlerFunc) {
		mux.Handle(pattern, s.counted(name, s.authed(h)))
	}
	rest(RouteJITConfigOrg, "POST /orgs/{org}/actions/runners/generate-jitconfig", s.handleJITConfig)
	rest(RouteJITConfigRepo, "POST /repos/{owner}/{repo}/actions/runners/generate-jitconfig", s.handleJITConfig)
	rest(RouteListRunnersOrg, "GET /orgs/{org}/actions/runners", s.handleListRunners)
	rest(RouteListRunnersRepo, "GET /repos/{owner}/{repo}/actions/runners", s.handleListRunners)
	rest(RouteGetRunnerOrg, "GET /orgs/{org}/actions/runners/{runner_id}", s.handleGetRunner)
	rest(RouteGetRunnerRepo, "GET /repos/{owner}/{repo}/actions/runners/{runner_id}", s.handleGetRunner)
	rest(RouteDeleteRunnerOrg, "DELETE /orgs/{org}/actions/runners/{runner_id}", s.handleDeleteRunner)
	rest(RouteDeleteRunnerRepo, "DELETE /repos/{owner}/{repo}/actions/runners/{runner_id}", s.handleDeleteRunner)
	rest(RouteGetJob, "GET /repos/{owner}/{repo}/actions/jobs/{job_id}", s.handleGetJob)
	rest(RouteListRuns, "GET /repos/{owner}/{repo}/actions/runs", s.handleListRuns)
	rest(RouteListRunJobs, "GET /repos/{owner}/{repo}/actions/runs/{run_id}/jobs", s.handleListRunJobs)
	rest(RouteInstallationToken, "POST /app/installations/{installation_id}/access_tokens", s.handleInstallationToken)
	rest(RouteRateLimit, "GET /rate_limit", s.handleRateLimit)
	rest(RouteHookDeliveriesApp, "GET /app/hook/deliveries", s.handleListHookDeliveries)
	rest(RouteHookDeliveriesOrg, "GET /orgs/{org}/hooks/{hook_id}/deliveries", s.handleListHookDeliveries)
	rest(RouteHookDeliveriesRepo, "GET /repos/{owner}/{repo}/hooks/{hook_id}/deliveries", s.handleListHookDeliveries)
	rest(RouteRedeliverApp, "POST /app/hook/deliveries/{delivery_id}/attempts", s.handleRedeliverHookDelivery)
	rest(RouteRedeliverOrg, "POST /orgs/{org}/hooks/{hook_id}/deliveries/{delivery_id}/attempts", s.handleRedeliverHookDelivery)
	rest(RouteRedeliverRepo, "POST /repos/{owner}/{repo}/hooks/{hook_id}/deliveries/{delivery_id}/attempts", s.handleRedeliverHookDelivery)
	mux.Handle("POST /_sim/runner/acquire", s.counted(RouteRunnerAcquire, http.HandlerFunc(s.handleAcquire)))
	mux.Handle("POST /_sim/runner/complete", s.counted(RouteRunnerComplete, http.HandlerFunc(s.handleComplete)))
	s.scaleSetRoutes(mux)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern == "" {
			s.count(RouteNotFound)
			s.rateHeaders(w)
			writeError(w, http.StatusNotFound, "Not Found", docsURL)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func (s *Sim) count(name string) {
	s.mu.Lock()
	s.apiCalls[name]++
	s.mu.Unlock()
}

// counted counts the call, sets GitHub's rate-limit headers and gives a
// rate-limit answer instead when RateLimit made one due.
func (s *Sim) counted(name string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.count(name)
		s.rateHeaders(w)
		if s.limited(name, w) || s.refused(name, w) {
			return
		}
		h.ServeHTTP(w, r)
	})
}

// rateHeaders consumes one unit of the hourly core budget and writes
// X-RateLimit-Limit/Remaining/Reset/Used/Resource like api.github.com.
func (s *Sim) rateHeaders(w http.ResponseWriter) {
	s.mu.Lock()
	now := time.Now()
	limit := cmp.Or(s.cfg.RateLimitPerHour, rateLimitPerHour)
	if !now.Before(s.rlReset) || s.rlUsed >= limit {
		s.rlUsed, s.rlReset = 0, now.Add(time.Hour)
	}
	s.rlUsed++
	used, reset := s.rlUsed, s.rlReset
	s.mu.Unlock()
	h := w.Header()
	h.Set("X-RateLimit-Limit", strconv.Itoa(limit))
	h.Set("X-RateLimit-Remaining", strconv.Itoa(limit-used))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(reset.Unix(), 10))
	h.Set("X-RateLimit-Used", strconv.Itoa(used))
	h.Set("X-RateLimit-Resource", "core")
	h.Set("X-GitHub-Media-Type", "github.v3; format=json")
	h.Set("X-GitHub-Request-Id", strings.ToUpper(randHex(8)))
}

// authed requires "Authorization: Bearer X" or "token X" (any X), answering 401
// {"message":"Requires authentication"} when the header is missing and
// {"message":"Bad credentials"} when it is malformed. It also 404s paths whose
// {org} or {owner}/{repo} is not Config.Org / Config.Repo (case-insensitive).
func (s *Sim) authed(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		if auth == "" {
			writeError(w, http.StatusUnauthorized, "Requires authentication", docsURL)
			return
		}
		scheme, cred, _ := strings.Cut(auth, " ")
		if (!strings.EqualFold(scheme, "bearer") && !strings.EqualFold(scheme, "token")) || strings.TrimSpace(cred) == "" {
			writeError(w, http.StatusUnauthorized, "Bad credentials", docsURL)
			return
		}
		org, owner, repo := r.PathValue("org"), r.PathValue("owner"), r.PathValue("repo")
		if (org != "" && !strings.EqualFold(org, s.cfg.Org)) ||
			(owner != "" && (!strings.EqualFold(owner, s.cfg.Org) || !strings.EqualFold(repo, s.cfg.Repo))) {
			writeError(w, http.StatusNotFound, "Not Found", docsURL)
			return
		}
		h(w, r)
	})
}

// scopeOf is "org" for /orgs/... routes and "repo" for /repos/... routes.
func scopeOf(r *http.Request) string {
	if r.PathValue("org") != "" {
		return "org"
	}
	return "repo"
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError writes GitHub's error body {"message":..,"documentation_url":..,"status":..}.
func writeError(w http.ResponseWriter, code int, msg, doc string) {
	writeJSON(w, code, map[string]any{"message": msg, "documentation_url": doc, "status": strconv.Itoa(code)})
}

// pageParams parses per_page (default 30, max 100) and page (default 1).
func pageParams(r *http.Request) (page, perPage int) {
	q := r.URL.Query()
	page, perPage = 1, 30
	if n, err := strconv.Atoi(q.Get("page")); err == nil && n > 0 {
		page = n
	}
	if n, err := strconv.Atoi(q.Get("per_page")); err == nil && n > 0 {
		perPage = min(n, 100)
	}
	return page, perPage
}

// paginate returns the [lo,hi) slice bounds for the page and sets a GitHub-style
// Link header (rel next/last/first/prev) so go-github fills Response.NextPage.
func paginate(w http.ResponseWriter, r *http.Request, base string, total int) (lo, hi int) {
	page, perPage := pageParams(r)
	last := max(1, (total+perPage-1)/perPage)
	link := func(p int, rel string) string {
		q := r.URL.Query()
		q.Set("page", strconv.Itoa(p))
		q.Set("per_page", strconv.Itoa(perPage))
		u := url.URL{Path: r.URL.Path, RawQuery: q.Encode()}
		return "<" + base + u.String() + `>; rel="` + rel + `"`
	}
	var links []string
	if page < last {
		links = append(links, link(page+1, "next"), link(last, "last"))
	}
	if page > 1 {
		links = append(links, link(1, "first"), link(min(page-1, last), "prev"))
	}
	if len(links) > 0 {
		w.Header().Set("Link", strings.Join(links, ", "))
	}
	lo = min((page-1)*perPage, total)
	return lo, min(lo+perPage, total)
}

// pathInt64 parses a numeric path value; ok is false when it is not a number.
func pathInt64(r *http.Request, name string) (int64, bool) {
	n, err := strconv.ParseInt(r.PathValue(name), 10, 64)
	return n, err == nil
}
