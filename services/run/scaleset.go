package run

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/actions/scaleset"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/dispatch"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/setintake"
)

// scaleSetIntake is the dispatcher's runner scale set side when
// dispatcher.github.intake is scaleset: the intake (started by start once
// the dispatcher exists) and the minter that routes its pools' JIT configs
// through their sets. nil when the intake is webhooks.
type scaleSetIntake struct {
	intake *setintake.Intake
	minter *setintake.Minter
}

// newScaleSetIntake builds the scale set client and opens berth_scalesets.
// gh is one installation (dispatcher.github's entry), named installation
// in its facts ("" the default).
func newScaleSetIntake(ctx context.Context, js jetstream.JetStream, cfg *config.Config, gh config.GitHub, installation string,
	rest *dispatch.GitHubMinter, app *eventlog.Appender, logger *slog.Logger) (*scaleSetIntake, error) {
	if gh.Intake != config.IntakeScaleSet {
		return nil, nil
	}
	cfgURL := scaleSetConfigURL(gh)
	client, err := scaleSetClient(gh, cfgURL)
	if err != nil {
		return nil, err
	}
	kv, err := eventlog.OpenBucket(ctx, js, events.BucketScaleSets, cfg.NATS.Replicas)
	if err != nil {
		return nil, err
	}
	sets := &setintake.Sets{}
	if installation != "" {
		logger = logger.With("installation", installation)
	}
	in := &setintake.Intake{Client: client, Log: app, KV: kv, Pools: gh.ScaleSet.Pools, RunnerGroup: gh.ScaleSet.RunnerGroup,
		Installation: installation,
		Owner:        "dispatcher-" + instance(cfg), LeaseTTL: gh.ScaleSet.LeaseTTL, Lister: rest, Sets: sets,
		ReconcileEvery: cfg.Dispatcher.ReconcileEvery, ReconcileLimit: cfg.Dispatcher.ReconcileLimit,
		Logger: logger.With("intake", "scaleset"), Metrics: &setintake.Metrics{}}
	// A dead holder's session is deleted through the registration
	// handshake: with the App, its installation makes the registration
	// token; with a token, the token does.
	in.Stale = &setintake.Registration{ConfigURL: cfgURL, RegistrationToken: setintake.RegistrationTokenFrom(rest.Client, cfgURL)}
	if token := config.Secret(gh.Token, gh.TokenEnv); token != "" && gh.App.ID == 0 {
		in.Stale = &setintake.Registration{ConfigURL: cfgURL,
			Token: func(context.Context) (string, error) { return token, nil }}
	}
	return &scaleSetIntake{intake: in, minter: &setintake.Minter{GitHubMinter: rest, Client: client, Sets: sets, Pools: gh.ScaleSet.Pools}}, nil
}

// minterOr is the scale-set-aware minter, or rest without the intake.
func (ss *scaleSetIntake) minterOr(rest *dispatch.GitHubMinter) dispatch.Minter {
	if ss == nil {
		return rest
	}
	return ss.minter
}

// start runs the intake on the dispatcher's fold.
func (ss *scaleSetIntake) start(ctx context.Context, s *System, d *dispatch.Dispatcher) {
	ss.intake.Read = d.Read
	s.goRun("setintake", func() error {
		_ = ss.intake.Run(ctx)
		return nil
	})
}

// scaleSetConfigURL is dispatcher.github.scale_set.config_url, or the
// organization's URL derived from api_url: https://github.com/ORG for
// api.github.com, else the server's root (without /api/v3) and ORG.
func scaleSetConfigURL(gh config.GitHub) string {
	if gh.ScaleSet.ConfigURL != "" {
		return gh.ScaleSet.ConfigURL
	}
	u, err := url.Parse(gh.APIURL)
	if err != nil || strings.EqualFold(u.Host, "api.github.com") {
		return "https://github.com/" + gh.Org
	}
	return u.Scheme + "://" + u.Host + "/" + gh.Org
}

// scaleSetClient is the scaleset library's client, with the App when one
// is configured, else the token.
func scaleSetClient(gh config.GitHub, cfgURL string) (*scaleset.Client, error) {
	info := scaleset.SystemInfo{System: "berth", Subsystem: "dispatcher"}
	opts := []scaleset.HTTPOption{scaleset.WithRetryMax(2), scaleset.WithRetryWaitMax(2 * time.Second)}
	if app := gh.App; app.ID != 0 {
		pem, err := os.ReadFile(app.PrivateKeyFile)
		if err != nil {
			return nil, fmt.Errorf("GitHub App private key %s: %w (dispatcher.github.app.private_key_file)", app.PrivateKeyFile, err)
		}
		return scaleset.NewClientWithGitHubApp(scaleset.ClientWithGitHubAppConfig{GitHubConfigURL: cfgURL, SystemInfo: info,
			GitHubAppAuth: scaleset.GitHubAppAuth{ClientID: strconv.FormatInt(app.ID, 10), InstallationID: app.InstallationID,
				PrivateKey: string(pem)}}, opts...)
	}
	token := config.Secret(gh.Token, gh.TokenEnv)
	if token == "" {
		return nil, fmt.Errorf("dispatcher.github.intake scaleset needs credentials: set dispatcher.github.app or token_env")
	}
	return scaleset.NewClientWithPersonalAccessToken(scaleset.NewClientWithPersonalAccessTokenConfig{GitHubConfigURL: cfgURL,
		PersonalAccessToken: token, SystemInfo: info}, opts...)
}
