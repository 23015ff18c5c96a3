package dispatch

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/google/go-github/v62/github"
)

// RedeliverWithin is how long GitHub keeps a delivery redeliverable: 3 days
// ("Redelivering webhooks", docs.github.com). Older failures are left.
const RedeliverWithin = 72 * time.Hour

// HookDelivery is one row of a hook's "Recent Deliveries": one attempt to
// deliver one event. A redelivery is a row of its own with the same GUID.
type HookDelivery struct {
	ID          int64  // the attempt's id, what a redelivery is asked for
	GUID        string // X-GitHub-Delivery, shared by every attempt of one delivery
	DeliveredAt time.Time
	StatusCode  int // the receiver's answer; 0 when GitHub could not connect
	Event       string
	Action      string
	Redelivery  bool
}

// Redeliverer reads a webhook's recent deliveries and asks GitHub to
// deliver one again (the hook-deliveries API of a GitHub App, an
// organization hook or a repository hook).
type Redeliverer interface {
	// HookDeliveries returns the recent deliveries, newest first, going no
	// further back than since, reading at most pages pages.
	HookDeliveries(ctx context.Context, since time.Time, pages int) ([]HookDelivery, error)
	// Redeliver asks GitHub to send the delivery attempt id again.
	Redeliver(ctx context.Context, id int64) error
}

// RedeliveryCandidates picks the failed workflow_job deliveries to ask
// GitHub to send again: younger than RedeliverWithin, no attempt of which
// was answered 2xx, whose GUID the log does not hold (a delivery the log
// holds changed nothing by failing: it was stored, then answered late),
// and not asked for since skip says; oldest first (closest to expiring), at
// most limit, one attempt per GUID. It is pure.
func RedeliveryCandidates(f *events.Fleet, rows []HookDelivery, now time.Time, limit int, skip func(guid string) bool) []HookDelivery {
	ok := map[string]bool{}
	for _, r := range rows {
		if r.StatusCode >= 200 && r.StatusCode < 300 {
			ok[r.GUID] = true
		}
	}
	picked := map[string]bool{}
	var out []HookDelivery
	for _, r := range rows {
		switch {
		case r.Event != "workflow_job", r.GUID == "", ok[r.GUID], picked[r.GUID]:
			continue
		case now.Sub(r.DeliveredAt) >= RedeliverWithin:
			continue
		}
		if f.DeliveryStored(r.GUID) || (skip != nil && skip(r.GUID)) {
			continue
		}
		picked[r.GUID] = true
		out = append(out, r)
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].DeliveredAt.Before(out[b].DeliveredAt) })
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out
}

// GitHubRedeliverer implements Redeliverer with go-github. For a GitHub App
// (HookID 0) it calls GET /app/hook/deliveries and POST
// /app/hook/deliveries/{id}/attempts, which GitHub authenticates with the
// App's JWT, not an installation token: Client must carry the App
// transport. For an organization hook it calls
// /orgs/{Org}/hooks/{HookID}/deliveries…, for a repository hook (Repo set)
// /repos/{Org}/{Repo}/hooks/{HookID}/deliveries….
type GitHubRedeliverer struct {
	Client    *github.Client
	Org, Repo string
	HookID    int64
	Budget    *Budget
}

// perPage is the largest page the deliveries list gives.
const perPage = 100

// HookDeliveries implements Redeliverer.
func (g *GitHubRedeliverer) HookDeliveries(ctx context.Context, since time.Time, pages int) ([]HookDelivery, error) {
	opts := &github.ListCursorOptions{PerPage: perPage}
	var out []HookDelivery
	for page := 0; page < pages; page++ {
		var (
			rows []*github.HookDelivery
			resp *github.Response
			err  error
		)
		switch {
		case g.HookID == 0:
			rows, resp, err = g.Client.Apps.ListHookDeliveries(ctx, opts)
		case g.Repo != "":
			rows, resp, err = g.Client.Repositories.ListHookDeliveries(ctx, g.Org, g.Repo, g.HookID, opts)
		default:
			rows, resp, err = g.Client.Organizations.ListHookDeliveries(ctx, g.Org, g.HookID, opts)
		}
		g.observe(resp, err)
		if err != nil {
			return out, fmt.Errorf("list hook deliveries: %w", err)
		}
		older := false
		for _, r := range rows {
			d := HookDelivery{ID: r.GetID(), GUID: r.GetGUID(), DeliveredAt: r.GetDeliveredAt().Time,
				StatusCode: r.GetStatusCode(), Event: r.GetEvent(), Action: r.GetAction(), Redelivery: r.GetRedelivery()}
			if d.DeliveredAt.Before(since) {
				older = true
				continue
			}
			out = append(out, d)
		}
		if older || resp == nil || resp.Cursor == "" {
			break
		}
		opts.Cursor = resp.Cursor
	}
	return out, nil
}

// Redeliver implements Redeliverer. GitHub answers 202 Accepted.
func (g *GitHubRedeliverer) Redeliver(ctx context.Context, id int64) error {
	var (
		resp *github.Response
		err  error
	)
	switch {
	case g.HookID == 0:
		_, resp, err = g.Client.Apps.RedeliverHookDelivery(ctx, id)
	case g.Repo != "":
		_, resp, err = g.Client.Repositories.RedeliverHookDelivery(ctx, g.Org, g.Repo, g.HookID, id)
	default:
		_, resp, err = g.Client.Organizations.RedeliverHookDelivery(ctx, g.Org, g.HookID, id)
	}
	g.observe(resp, err)
	var accepted *github.AcceptedError
	if errors.As(err, &accepted) {
		return nil // go-github reports 202 as an AcceptedError
	}
	if err != nil {
		return fmt.Errorf("redeliver hook delivery %d: %w", id, err)
	}
	return nil
}

func (g *GitHubRedeliverer) observe(resp *github.Response, err error) { g.Budget.ObserveAPI(resp, err) }

// Redelivery pacing: a GUID asked for is not asked for again for
// redeliverAgainAfter (its redelivery may be on the way, or fail again);
// one round reads at most redeliverPages pages of the deliveries list.
const (
	redeliverAgainAfter = 10 * time.Minute
	redeliverPages      = 3
)

// redeliver runs one redelivery round off the loop: it reads the hook's
// recent deliveries, picks on the loop (against the fold) the failed ones
// the log does not hold, and asks GitHub for them one at a time (GitHub
// asks for mutating calls to be serialised), at most Reconcile.Limit, and
// none while the rate-limit budget says to wait.
func (d *Dispatcher) redeliver(ctx context.Context, now time.Time) {
	rd := d.opts.Redeliverer
	if rd == nil || d.redelivering {
		return
	}
	d.redelivering = true
	limit, logger := d.opts.Reconcile.Limit, d.opts.Logger
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		done := func() { d.Loop.Post(ctx, func() { d.redelivering = false }) }
		lctx, cancel := context.WithTimeout(ctx, d.opts.MintTimeout)
		rows, err := rd.HookDeliveries(lctx, now.Add(-RedeliverWithin), redeliverPages)
		cancel()
		if err != nil {
			// A failed read is no fact (law 7): what was read is still used.
			logger.Warn("hook deliveries not read; the next round retries", "err", err)
		}
		if len(rows) == 0 {
			done()
			return
		}
		d.Loop.Post(ctx, func() {
			picked := RedeliveryCandidates(d.Fold, rows, d.opts.Now(), limit, func(guid string) bool {
				_, asked := d.redelivered[guid]
				return asked
			})
			if len(picked) == 0 {
				d.redelivering = false
				return
			}
			at := d.opts.Now()
			for _, p := range picked {
				d.redelivered[p.GUID] = at
			}
			d.wg.Add(1)
			go func() {
				defer d.wg.Done()
				var unasked []string // not asked for after all: free for the next round
				defer func() {
					d.Loop.Post(ctx, func() {
						d.redelivering = false
						for _, guid := range unasked {
							delete(d.redelivered, guid)
						}
					})
				}()
				for i, p := range picked {
					if blocked, until := d.rateLimited(time.Now()); blocked {
						logger.Info("GitHub rate limit: redeliveries wait for the next round", "until", until.Format(time.RFC3339))
						for _, q := range picked[i:] {
							unasked = append(unasked, q.GUID)
						}
						return
					}
					rctx, cancel := context.WithTimeout(ctx, d.opts.MintTimeout)
					err := rd.Redeliver(rctx, p.ID)
					cancel()
					if err != nil {
						logger.Warn("redelivery not accepted; asked again in a later round", "delivery", p.GUID, "err", err)
						unasked = append(unasked, p.GUID)
						continue
					}
					logger.Warn("a webhook delivery failed; GitHub was asked to deliver it again",
						"delivery", p.GUID, "action", p.Action, "status", p.StatusCode, "delivered_at", p.DeliveredAt.Format(time.RFC3339))
				}
			}()
		})
	}()
}
