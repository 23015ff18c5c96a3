package run

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/dispatch"
	"github.com/berth-ci/berth/services/eventlog"
)

// installation is one dispatcher.github entry, built: its REST client and
// budget, and its scale set intake (nil with webhooks).
type installation struct {
	name   string // "" for the default (first) one
	gh     config.GitHub
	rest   *dispatch.GitHubMinter
	budget *dispatch.Budget
	sets   *scaleSetIntake
}

// installations is every configured installation, the default first.
type installations []installation

// newInstallations builds each dispatcher.github entry.
func newInstallations(ctx context.Context, js jetstream.JetStream, cfg *config.Config, app *eventlog.Appender,
	logger *slog.Logger) (installations, error) {
	var out installations
	for i, gh := range cfg.Dispatcher.GitHub.Installations() {
		name := cfg.Dispatcher.GitHub.InstallationOf(i)
		client, err := githubClient(gh)
		if err != nil {
			return nil, installErr(name, err)
		}
		budget := &dispatch.Budget{}
		rest := &dispatch.GitHubMinter{Client: client, Scope: gh.Scope, Org: gh.Org, RunnerGroupID: gh.RunnerGroupID, Budget: budget}
		sets, err := newScaleSetIntake(ctx, js, cfg, gh, name, rest, app, logger)
		if err != nil {
			return nil, installErr(name, err)
		}
		out = append(out, installation{name: name, gh: gh, rest: rest, budget: budget, sets: sets})
	}
	return out, nil
}

func installErr(name string, err error) error {
	if name == "" {
		return err
	}
	return fmt.Errorf("installation %s: %w", name, err)
}

// more is every installation after the default, for dispatch.Options.
func (is installations) more() []dispatch.Installation {
	var out []dispatch.Installation
	for _, in := range is[1:] {
		out = append(out, dispatch.Installation{Name: in.name, Minter: in.sets.minterOr(in.rest), Budget: in.budget,
			SweepScope: in.gh.Scope, SweepOrg: in.gh.Org})
	}
	return out
}

// scaleSetJob is whether a job's labels are any installation's scale-set
// pool's (nil when no installation reads scale sets).
func (is installations) scaleSetJob() func([]string) bool {
	var serves []func([]string) bool
	for _, in := range is {
		if f := in.sets.serves(); f != nil {
			serves = append(serves, f)
		}
	}
	if len(serves) == 0 {
		return nil
	}
	return func(labels []string) bool {
		for _, f := range serves {
			if f(labels) {
				return true
			}
		}
		return false
	}
}

// webhooks serves each installation's webhook: the default's at /webhook,
// each other's at /webhook/NAME, each checked with its own secret (else
// dispatcher.webhook_secret) and its facts naming its installation.
func (is installations) webhooks(mux *http.ServeMux, dc config.Dispatcher, app *eventlog.Appender, logger *slog.Logger,
	metrics *dispatch.Metrics) error {
	fallback := config.Secret(dc.WebhookSecret, dc.WebhookSecretEnv)
	for _, in := range is {
		secret := config.Secret(in.gh.WebhookSecret, in.gh.WebhookSecretEnv)
		if secret == "" {
			secret = fallback
		}
		path := "/webhook"
		if in.name != "" {
			path += "/" + in.name
		}
		if secret == "" {
			return fmt.Errorf("dispatcher: no webhook secret for %s: set dispatcher.webhook_secret or webhook_secret_env (GitHub signs every delivery with it)", path)
		}
		hooks := &dispatch.Intake{Secret: []byte(secret), Log: app, Now: time.Now, Logger: logger, Metrics: metrics,
			ScaleSet: in.sets.serves(), Installation: in.name}
		mux.Handle("POST "+path, hooks)
	}
	return nil
}
