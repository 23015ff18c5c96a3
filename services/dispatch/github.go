package dispatch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/google/go-github/v62/github"
)

// GitHubMinter mints JIT configs through go-github against a configurable
// API base (github.com, GitHub Enterprise Server, or the simulator).
type GitHubMinter struct {
	Client        *github.Client
	Scope         string // "org" or "repo"
	Org           string // for org scope; empty means the job's owner
	RunnerGroupID int64
	// Budget, when set, learns the API budget from every answer.
	Budget *Budget
}

// NewGitHubClient builds a go-github client for a token and a REST base URL
// (a trailing slash is added; GitHub Enterprise Server bases end in /api/v3/).
func NewGitHubClient(apiURL, token string, hc *http.Client) (*github.Client, error) {
	c := github.NewClient(hc)
	if token != "" {
		c = c.WithAuthToken(token)
	}
	if !strings.HasSuffix(apiURL, "/") {
		apiURL += "/"
	}
	u, err := url.Parse(apiURL)
	if err != nil {
		return nil, fmt.Errorf("github api_url %q: %w", apiURL, err)
	}
	c.BaseURL = u
	return c, nil
}

// Mint implements Minter with POST /orgs/{org}/actions/runners/generate-jitconfig
// or POST /repos/{owner}/{repo}/actions/runners/generate-jitconfig.
func (m *GitHubMinter) Mint(ctx context.Context, r MintRequest) (int64, string, error) {
	group := m.RunnerGroupID
	if group == 0 {
		group = 1 // the "Default" runner group
	}
	req := &github.GenerateJITConfigRequest{Name: r.RunnerName, RunnerGroupID: group, Labels: r.Labels}
	var (
		jit  *github.JITRunnerConfig
		resp *github.Response
		err  error
	)
	if m.Scope == "repo" {
		jit, resp, err = m.Client.Actions.GenerateRepoJITConfig(ctx, r.Org, r.Repo, req)
	} else {
		org := m.Org
		if org == "" {
			org = r.Org
		}
		jit, resp, err = m.Client.Actions.GenerateOrgJITConfig(ctx, org, req)
	}
	m.Budget.ObserveAPI(resp, err)
	if err != nil {
		return 0, "", fmt.Errorf("generate JIT config for runner %s: %w", r.RunnerName, err)
	}
	return jit.GetRunner().GetID(), jit.GetEncodedJITConfig(), nil
}

// Deregister implements Minter with DELETE /orgs/{org}/actions/runners/{id}
// (or the repo variant). GitHub answers 204 when deleted, 404 when the
// runner is already gone (an ephemeral runner is removed after its job) and
// 422 "Runner ... is still running a job" when it is busy.
func (m *GitHubMinter) Deregister(ctx context.Context, runnerID int64, org, repo string) error {
	var (
		resp *github.Response
		err  error
	)
	if m.Scope == "repo" {
		resp, err = m.Client.Actions.RemoveRunner(ctx, org, repo, runnerID)
	} else {
		if m.Org != "" {
			org = m.Org
		}
		resp, err = m.Client.Actions.RemoveOrganizationRunner(ctx, org, runnerID)
	}
	m.Budget.ObserveAPI(resp, err)
	switch {
	case err == nil:
		return nil
	case resp != nil && resp.StatusCode == http.StatusNotFound:
		return nil // confirmed gone (law 7: a confirmed 404 for a thing being deleted is success)
	case resp != nil && resp.StatusCode == http.StatusUnprocessableEntity:
		return fmt.Errorf("%w: runner %d: %v", ErrRunnerBusy, runnerID, err)
	}
	return fmt.Errorf("delete runner %d: %w", runnerID, err)
}

// MintRetryable reports whether a failed mint should be tried again with the
// same attempt rather than release the slot: a timeout, a transport error,
// a 5xx, a rate limit, or 409 Conflict, which means a runner with the
// attempt's name already exists (another dispatcher replica, or an earlier
// try whose answer was lost, minted it; its placement or the provisioning
// deadline settles the attempt). Any other 4xx is GitHub refusing.
func MintRetryable(err error) bool {
	var er *github.ErrorResponse
	if !errors.As(err, &er) || er.Response == nil {
		return true // a timeout, a transport error, or a typed rate-limit error
	}
	switch code := er.Response.StatusCode; {
	case code == http.StatusConflict, code == http.StatusTooManyRequests, code >= 500:
		return true
	case code == http.StatusForbidden:
		return isSecondary(err) || er.Response.Header.Get("X-RateLimit-Remaining") == "0"
	}
	return false
}

// Spare reports whether an optional search may spend the REST budget: a
// quarter of the limit stays for JIT configs and the reads that release
// slots (Budget.Spare).
func (m *GitHubMinter) Spare() bool { return m.Budget.Spare(0.25) }
