package dispatch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/google/go-github/v62/github"
)

// The runner sweep (issue 17, class 5): a registration whose mint answer
// was lost (GitHub registered the runner, the dispatcher never learnt its
// id), or whose placement was lost, is deleted by nothing else: the fold
// never holds its runner id, so no DeregisterCall names it. The sweep lists
// GitHub's self-hosted runners, picks those named after a Berth attempt
// that no live attempt accounts for, and deletes them after a grace.

// Sweep tunes the runner sweep (config: dispatcher.runner_sweep_*).
type Sweep struct {
	// Every paces the passes (plus up to a fifth of it in jitter); 0 turns
	// the sweep off.
	Every time.Duration
	// Grace: a runner is deleted only after every pass for this long saw
	// it stranded.
	Grace time.Duration
	// Limit caps deletions per pass, so an outage's stranded runners are
	// reaped over several passes rather than in a storm of DELETEs.
	Limit int
}

// DefaultSweepLimit is Sweep.Limit's default.
const DefaultSweepLimit = 20

// GitHubRunner is one self-hosted runner GitHub lists, with the scope it
// was listed in (Org, and Repo for a repository's runners): where DELETE
// goes.
type GitHubRunner struct {
	ID        int64
	Name      string
	Status    string // online, offline
	Busy      bool
	Org, Repo string
	// Installation is whose list it came from: its client deletes it.
	Installation string
}

// RunnerLister is implemented by a Minter that can list the self-hosted
// runners of an org (repo "") or a repository, every page.
type RunnerLister interface {
	ListRunners(ctx context.Context, org, repo string) ([]GitHubRunner, error)
}

// SweepPick picks the runners to delete in this pass, and returns the
// stranded runners to remember (runner id → the pass that first saw it
// stranded) for the next one. It is pure.
//
// A runner is stranded when its name is a Berth attempt id, GitHub does not
// call it busy, and no live attempt accounts for it: its attempt is unknown
// to the fold (a lost mint answer, or compacted long ago) or is over (not
// holding a slot, its VM not live) and no job in progress is bound to it.
// It is picked once it has been seen stranded for Grace, oldest first, at
// most Limit. listed false (a failed or partial read) or an empty list
// picks nothing and forgets nothing (law 7: a negative read is not a fact).
func SweepPick(f *events.Fleet, list []GitHubRunner, listed bool, seen map[int64]time.Time, now time.Time, s Sweep) ([]GitHubRunner, map[int64]time.Time) {
	if !listed || len(list) == 0 {
		return nil, seen
	}
	next := map[int64]time.Time{}
	var due []GitHubRunner
	for _, r := range list {
		if !stranded(f, r) {
			continue
		}
		first, ok := seen[r.ID]
		if !ok {
			first = now
		}
		next[r.ID] = first
		if now.Sub(first) >= s.Grace {
			due = append(due, r)
		}
	}
	sort.Slice(due, func(i, j int) bool {
		if a, b := next[due[i].ID], next[due[j].ID]; !a.Equal(b) {
			return a.Before(b)
		}
		return due[i].ID < due[j].ID
	})
	limit := s.Limit
	if limit <= 0 {
		limit = DefaultSweepLimit
	}
	if len(due) > limit {
		due = due[:limit]
	}
	return due, next
}

// stranded reports whether r is Berth's and nothing live accounts for it.
func stranded(f *events.Fleet, r GitHubRunner) bool {
	if r.Busy || !events.IsAttemptID(r.Name) {
		return false
	}
	if a := f.Attempts[r.Name]; a != nil && (a.Held() || a.VMLive() || (a.Placed && !a.Stopped)) {
		return false
	}
	if j := f.Jobs[f.BoundJob(r.Name)]; j != nil && j.Status == events.StatusInProgress {
		return false
	}
	return true
}

// SweepScopes is where the sweep lists one installation's runners: its
// configured org (org scope), else every owner (org scope) or owner/repo
// (repo scope) a job of that installation in the fold names, sorted.
func SweepScopes(f *events.Fleet, installation, scope, org string) [][2]string {
	if scope != "repo" && org != "" {
		return [][2]string{{org, ""}}
	}
	repos := ReconcileRepos(f, installation)
	if scope == "repo" {
		return repos
	}
	var out [][2]string
	for _, r := range repos {
		if len(out) == 0 || out[len(out)-1][0] != r[0] {
			out = append(out, [2]string{r[0], ""})
		}
	}
	return out
}

// ListRunners implements RunnerLister: GET /orgs/{org}/actions/runners or
// GET /repos/{owner}/{repo}/actions/runners, 100 a page, every page.
func (m *GitHubMinter) ListRunners(ctx context.Context, org, repo string) ([]GitHubRunner, error) {
	var out []GitHubRunner
	opts := &github.ListRunnersOptions{ListOptions: github.ListOptions{PerPage: 100}}
	for {
		var (
			page *github.Runners
			resp *github.Response
			err  error
		)
		if repo != "" {
			page, resp, err = m.Client.Actions.ListRunners(ctx, org, repo, opts)
		} else {
			page, resp, err = m.Client.Actions.ListOrganizationRunners(ctx, org, opts)
		}
		m.observe(resp, err)
		if err != nil {
			return nil, fmt.Errorf("list runners of %s/%s (page %d): %w", org, repo, opts.Page, err)
		}
		for _, r := range page.Runners {
			out = append(out, GitHubRunner{ID: r.GetID(), Name: r.GetName(), Status: r.GetStatus(), Busy: r.GetBusy(), Org: org, Repo: repo})
		}
		if resp.NextPage == 0 {
			return out, nil
		}
		opts.Page = resp.NextPage
	}
}

// sweepState is the sweep's bookkeeping, owned by the loop.
type sweepState struct {
	next    time.Time           // the next pass, jittered
	seen    map[int64]time.Time // stranded runner id → first seen so
	running bool                // a pass is off the loop
}

// sweep starts a pass off the loop when one is due: list every scope
// (under the rate budget; a failed scope is left out, and a pass with a
// failed scope deletes nothing in it), pick on the loop, delete one at a
// time through Deregister (404 is gone).
func (d *Dispatcher) sweep(ctx context.Context, now time.Time) {
	s := d.opts.Sweep
	if s.Every <= 0 || d.sweeps.running {
		return
	}
	if d.sweeps.next.IsZero() {
		d.sweeps.next = now.Add(jitter(s.Every)) // not at start: the fold is young
	}
	if now.Before(d.sweeps.next) {
		return
	}
	d.sweeps.next = now.Add(jitter(s.Every))
	var lists []sweepList
	for _, in := range d.installs() {
		lister, ok := in.Minter.(RunnerLister)
		if blocked, _ := in.blocked(now); !ok || blocked {
			continue
		}
		if scopes := SweepScopes(d.Fold, in.Name, in.SweepScope, in.SweepOrg); len(scopes) > 0 {
			lists = append(lists, sweepList{in, lister, scopes})
		}
	}
	if len(lists) == 0 {
		return
	}
	d.sweeps.running = true
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		var all []GitHubRunner
		listed := true
		for _, l := range lists {
			list, ok := d.listRunners(ctx, l.in, l.lister, l.scopes)
			all, listed = append(all, list...), listed && ok
		}
		d.Loop.Post(ctx, func() { d.reap(ctx, all, listed) })
	}()
}

// sweepList is one installation's part of a sweep pass.
type sweepList struct {
	in     Installation
	lister RunnerLister
	scopes [][2]string
}

// jitter is every plus up to a fifth of it.
func jitter(every time.Duration) time.Duration {
	return every + rand.N(every/5+1)
}

func (d *Dispatcher) listRunners(ctx context.Context, in Installation, lister RunnerLister, scopes [][2]string) ([]GitHubRunner, bool) {
	var all []GitHubRunner
	for _, sc := range scopes {
		if blocked, _ := in.blocked(time.Now()); blocked {
			return nil, false
		}
		lctx, cancel := context.WithTimeout(ctx, d.opts.MintTimeout)
		rs, err := lister.ListRunners(lctx, sc[0], sc[1])
		cancel()
		if err != nil {
			d.opts.Logger.Info("runner sweep: list failed; this pass deletes nothing", "org", sc[0], "repo", sc[1], "err", err)
			return nil, false
		}
		for _, r := range rs {
			r.Installation = in.Name
			all = append(all, r)
		}
	}
	return all, true
}

// reap picks on the loop and deletes the picks off it, one at a time.
func (d *Dispatcher) reap(ctx context.Context, list []GitHubRunner, listed bool) {
	var picks []GitHubRunner
	picks, d.sweeps.seen = SweepPick(d.Fold, list, listed, d.sweeps.seen, d.Now(), d.opts.Sweep)
	if len(picks) == 0 {
		d.sweeps.running = false
		return
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer d.Loop.Post(ctx, func() { d.sweeps.running = false })
		for _, r := range picks {
			dctx, cancel := context.WithTimeout(ctx, d.opts.MintTimeout)
			err := ErrRunnerBusy // never delete through another installation's client
			if in, ok := d.install(r.Installation); ok {
				err = in.Minter.Deregister(dctx, r.ID, r.Org, r.Repo)
			}
			cancel()
			d.swept(ctx, r, err)
		}
	}()
}

// swept records one deletion's outcome from the loop.
func (d *Dispatcher) swept(ctx context.Context, r GitHubRunner, err error) {
	logger := d.opts.Logger.With("attempt", r.Name, "runner_id", r.ID, "org", r.Org, "repo", r.Repo)
	switch {
	case errors.Is(err, ErrRunnerBusy):
		logger.Info("runner sweep: the runner took a job since the list; leaving it")
		return
	case err != nil:
		logger.Warn("runner sweep: delete failed; a later pass tries again", "err", err)
		return
	}
	d.metrics.swept.Inc()
	logger.Warn("runner sweep: deleted a registration no live attempt accounts for (a lost mint answer or placement)")
	d.Loop.Post(ctx, func() {
		delete(d.sweeps.seen, r.ID)
		if a := d.Fold.Attempts[r.Name]; a != nil && !a.Deregistered && a.Pool != "" && a.Host != "" {
			_ = d.Append(ctx, events.AttemptDeregistered{AttemptRef: events.AttemptRef{Attempt: a.ID, Pool: a.Pool, Host: a.Host}, RunnerID: r.ID})
		}
	})
}
