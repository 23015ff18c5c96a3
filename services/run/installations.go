package run

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/berth-ci/berth/events"
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

// scaleSetJob is whether, by the fold, a job's labels are any
// installation's scale-set pool's (nil when no installation reads scale
// sets).
func (is installations) scaleSetJob() func(*events.Fleet, []string) bool {
	var pools []string
	for _, in := range is {
		pools = append(pools, in.scaleSetPools()...)
	}
	if len(pools) == 0 {
		return nil
	}
	return servedBy(pools)
}

// scaleSetPools is the installation's scale-set pools (none with webhooks).
func (in installation) scaleSetPools() []string {
	if in.sets == nil {
		return nil
	}
	return in.gh.ScaleSet.Pools
}

// servedBy reports from a fold whether one of pools, with the labels its
// hosts offer it under, serves a job's labels. A pool no host offers yet
// serves nothing: it has no scale set either.
func servedBy(pools []string) func(*events.Fleet, []string) bool {
	return func(f *events.Fleet, labels []string) bool {
		byPool := f.PoolLabels()
		for _, p := range pools {
			if l, ok := byPool[p]; ok && events.Serves(l, labels) {
				return true
			}
		}
		return false
	}
}

// errCatchingUp: the dispatcher's fold has not read the whole log since it
// started, so what it says of the pools may be out of date.
var errCatchingUp = errors.New("the dispatcher's fold has not read the whole event log yet")

// scaleSetWebhook is the webhook intake's ScaleSet for one installation:
// servedBy its scale-set pools, read from the dispatcher's fold once that
// has read the whole log (nil with webhooks only).
func (in installation) scaleSetWebhook(d *dispatch.Dispatcher) func(context.Context, []string) (bool, error) {
	pools := in.scaleSetPools()
	if len(pools) == 0 {
		return nil
	}
	serves := servedBy(pools)
	return func(ctx context.Context, labels []string) (bool, error) {
		if !d.Loop.CaughtUp() {
			return false, errCatchingUp
		}
		var yes bool
		err := d.Read(ctx, func(f *events.Fleet) { yes = serves(f, labels) })
		return yes, err
	}
}

// webhooks serves each installation's webhook: the default's at /webhook,
// each other's at /webhook/NAME, each checked with its own secret (else
// dispatcher.webhook_secret) and its facts naming its installation.
func (is installations) webhooks(mux *http.ServeMux, dc config.Dispatcher, app *eventlog.Appender, logger *slog.Logger,
	metrics *dispatch.Metrics, d *dispatch.Dispatcher) error {
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
			ScaleSet: in.scaleSetWebhook(d), Installation: in.name}
		mux.Handle("POST "+path, hooks)
	}
	return nil
}
