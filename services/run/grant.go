package run

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/natsauth"
	"github.com/nats-io/nats.go/jetstream"
)

// AgentGrant is the admin's grant of exactly what an agent run from ac
// announces: its pools (each named shape a pool of its own), their labels
// and slots, and its physical cap (events.GrantFor).
func AgentGrant(ac config.Agent, by string, at time.Time) events.HostGranted {
	return events.GrantFor(ac.Host, ac.AdvertisedPools(), ac.PhysicalCap, by, at)
}

// Grant writes g to the log as the admin (berth.evt.host.<host>.admin):
// only the admin's credential may publish there (natsauth), so js must be
// the admin's (or a dev server's, without authorization).
func Grant(ctx context.Context, js jetstream.JetStream, g events.HostGranted) error {
	app := &eventlog.Appender{JS: js, Source: "berth/admin", Role: events.RoleAdmin, NoReadBack: true}
	// Confirmed: a grant's Nats-Msg-Id another writer took must not read
	// as "granted" while nothing was stored (issue 16).
	if _, err := app.AppendConfirmed(ctx, app.New(g.At, g), nil); err != nil {
		return fmt.Errorf("grant host %s: %w (only the admin may grant: berth --nats-nkey admin.nk)", g.Host, err)
	}
	return nil
}

// GrantAgents grants every agent in agents what it announces (AgentGrant),
// as an operator does for the hosts it runs: `berth stream apply
// --grant-agents`, `berth dev` and every test harness that starts agents.
// It returns one line per host granted.
func GrantAgents(ctx context.Context, js jetstream.JetStream, agents []config.Agent, by string) ([]string, error) {
	var lines []string
	for _, ac := range agents {
		g := AgentGrant(ac, by, time.Now().UTC())
		if err := Grant(ctx, js, g); err != nil {
			return lines, err
		}
		lines = append(lines, GrantLine(g))
	}
	return lines, nil
}

// GrantAgentsAt is GrantAgents on a connection of its own to url, with
// the tools' credentials (ClientNKey, ClientCreds: the admin's): what a
// harness that starts agents outside `berth dev` does first.
func GrantAgentsAt(ctx context.Context, url string, agents []config.Agent, by string) error {
	closeNC, js, err := JetStreamAs(url, natsauth.RoleAdmin)
	if err != nil {
		return err
	}
	defer closeNC()
	_, err = GrantAgents(ctx, js, agents, by)
	return err
}

// GrantLine says what a grant lets its host offer.
func GrantLine(g events.HostGranted) string {
	if len(g.Pools) == 0 {
		return fmt.Sprintf("host %s: revoked: offered nothing", g.Host)
	}
	s := fmt.Sprintf("host %s: granted", g.Host)
	for _, name := range slices.Sorted(maps.Keys(g.Pools)) {
		p := g.Pools[name]
		s += fmt.Sprintf(" %s (%d slots, labels %v)", name, p.Slots, p.Labels)
	}
	return s + fmt.Sprintf(", physical cap %d", g.Cap())
}
