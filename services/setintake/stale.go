package setintake

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/google/go-github/v62/github"
)

// SessionDeleter deletes a message session this process did not open: the
// one a dead holder left, which makes GitHub answer 409 to a new one.
type SessionDeleter interface {
	DeleteSession(ctx context.Context, scaleSetID int, sessionID string) error
}

// Registration deletes stale sessions through the same handshake the
// scaleset client makes, since the client deletes only sessions it opened:
// a registration token (POST …/actions/runners/registration-token with the
// token), the actions service's URL and admin token (POST
// /actions/runner-registration with "RemoteAuth <registration token>"),
// then DELETE _apis/runtime/runnerscalesets/{id}/sessions/{sid}. The API
// base follows the client's rule: https://api.github.com for github.com,
// else <host>/api/v3 (GitHub Enterprise Server, the simulator).
type Registration struct {
	ConfigURL string // e.g. https://github.com/my-org or https://ghes.example/my-org/my-repo
	// Token is a token that may create registration tokens (a PAT);
	// RegistrationToken, when set, makes the registration token itself
	// instead (with a GitHub App: RegistrationTokenFrom).
	Token             func(ctx context.Context) (string, error)
	RegistrationToken func(ctx context.Context) (string, error)
	HTTP              *http.Client
}

// RegistrationTokenFrom makes registration tokens with a go-github client
// (its transport carries the App's installation token): POST
// /orgs/{org}/actions/runners/registration-token, or the repository's for
// a config URL naming one.
func RegistrationTokenFrom(gh *github.Client, configURL string) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		owner, repo, err := scope(configURL)
		if err != nil {
			return "", err
		}
		var tok *github.RegistrationToken
		if repo == "" {
			tok, _, err = gh.Actions.CreateOrganizationRegistrationToken(ctx, owner)
		} else {
			tok, _, err = gh.Actions.CreateRegistrationToken(ctx, owner, repo)
		}
		if err != nil {
			return "", fmt.Errorf("registration token for %s: %w", configURL, err)
		}
		return tok.GetToken(), nil
	}
}

// scope is the config URL's organization, and its repository if it names
// one.
func scope(configURL string) (owner, repo string, err error) {
	u, err := url.Parse(strings.TrimSuffix(configURL, "/"))
	if err != nil {
		return "", "", err
	}
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	if parts[0] == "" || len(parts) > 2 {
		return "", "", fmt.Errorf("config URL %q names no organization or repository (dispatcher.github.scale_set.config_url)", configURL)
	}
	if len(parts) == 2 {
		repo = parts[1]
	}
	return parts[0], repo, nil
}

// DeleteSession deletes the session; a 404 (already gone) is success.
func (r *Registration) DeleteSession(ctx context.Context, scaleSetID int, sessionID string) error {
	svc, admin, err := r.admin(ctx)
	if err != nil {
		return err
	}
	u := strings.TrimSuffix(svc, "/") + fmt.Sprintf("/_apis/runtime/runnerscalesets/%d/sessions/%s?api-version=6.0-preview", scaleSetID, url.PathEscape(sessionID))
	code, err := r.do(ctx, http.MethodDelete, u, "Bearer "+admin, nil, nil)
	switch {
	case err != nil:
		return fmt.Errorf("delete stale session %s: %w", sessionID, err)
	case code == http.StatusNoContent, code == http.StatusOK, code == http.StatusNotFound:
		return nil
	}
	return fmt.Errorf("delete stale session %s: GitHub answered %d; it expires by itself if nothing polls it", sessionID, code)
}

// admin runs the registration handshake: the actions service URL and an
// admin token.
func (r *Registration) admin(ctx context.Context) (string, string, error) {
	cfg, err := url.Parse(strings.TrimSuffix(r.ConfigURL, "/"))
	if err != nil || (r.Token == nil && r.RegistrationToken == nil) {
		return "", "", fmt.Errorf("stale session delete needs dispatcher.github.scale_set.config_url and credentials (%v)", err)
	}
	api := cfg.Scheme + "://" + cfg.Host + "/api/v3"
	if strings.EqualFold(cfg.Host, "github.com") || strings.EqualFold(cfg.Host, "www.github.com") {
		api = "https://api.github.com"
	}
	reg, err := r.registrationToken(ctx, api)
	if err != nil {
		return "", "", err
	}
	body := map[string]string{"url": cfg.String(), "runner_event": "register"}
	var conn struct {
		URL   string `json:"url"`
		Token string `json:"token"`
	}
	if code, err := r.do(ctx, http.MethodPost, api+"/actions/runner-registration", "RemoteAuth "+reg, body, &conn); err != nil || code/100 != 2 {
		return "", "", fmt.Errorf("runner registration: status %d, %v", code, err)
	}
	return conn.URL, conn.Token, nil
}

// registrationToken is RegistrationToken's, or one made with Token.
func (r *Registration) registrationToken(ctx context.Context, api string) (string, error) {
	if r.RegistrationToken != nil {
		return r.RegistrationToken(ctx)
	}
	owner, repo, err := scope(r.ConfigURL)
	if err != nil {
		return "", err
	}
	path := "/orgs/" + owner + "/actions/runners/registration-token"
	if repo != "" {
		path = "/repos/" + owner + "/" + repo + "/actions/runners/registration-token"
	}
	tok, err := r.Token(ctx)
	if err != nil {
		return "", fmt.Errorf("token for the registration handshake: %w", err)
	}
	var reg struct {
		Token string `json:"token"`
	}
	if code, err := r.do(ctx, http.MethodPost, api+path, "Bearer "+tok, nil, &reg); err != nil || code != http.StatusCreated {
		return "", fmt.Errorf("registration token: status %d, %v", code, err)
	}
	return reg.Token, nil
}

func (r *Registration) do(ctx context.Context, method, u, auth string, in, out any) (int, error) {
	var body bytes.Buffer
	if in != nil {
		_ = json.NewEncoder(&body).Encode(in)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, &body)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", auth)
	req.Header.Set("Content-Type", "application/json")
	hc := r.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if out != nil && resp.StatusCode/100 == 2 {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return resp.StatusCode, err
		}
	}
	return resp.StatusCode, nil
}
