package setintake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/actions/scaleset"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/clock"
	"github.com/berth-ci/berth/services/eventlog"
)

// DefaultLeaseTTL is how long a set's record may stand still before another
// replica takes the set over; the holder renews it every third of that.
const DefaultLeaseTTL = 6 * time.Second

// Intake serves Pools through runner scale sets. Its fields are set before
// Run and not changed after.
type Intake struct {
	Client *scaleset.Client
	Log    *eventlog.Appender
	// KV is the bucket berth_scalesets (lease, session, cursor per set).
	KV jetstream.KeyValue
	// Read runs fn on the dispatcher's fold, on its loop (Dispatcher.Read).
	Read  func(ctx context.Context, fn func(*events.Fleet)) error
	Pools []string
	// Installation names the GitHub installation the sets belong to ("":
	// the default one): every job fact the intake stores carries it.
	Installation string
	// RunnerGroup names the sets' runner group; "" means the default one.
	RunnerGroup string
	// Owner names this replica in leases and sessions; unique per replica
	// and the same across its restarts.
	Owner    string
	LeaseTTL time.Duration
	// Stale deletes a dead holder's session on 409; nil waits for GitHub
	// to expire it.
	Stale SessionDeleter
	// Lister reads the REST API's jobs for the statistics reconciler; nil
	// turns it off.
	Lister REST
	// ReconcileEvery bounds how often a set's statistics gap is read
	// from the REST API (dispatcher.reconcile_every); 0: a minute.
	ReconcileEvery time.Duration
	// ReconcileLimit caps the runs a round reads, one REST call each
	// (dispatcher.reconcile_limit); 0: DefaultReconcileLimit.
	ReconcileLimit int
	// Sets is filled with each pool's scale set (the Minter reads it).
	Sets   *Sets
	Clock  clock.Clock
	Logger *slog.Logger
	// Metrics counts what the intake did (may be nil).
	Metrics *Metrics
}

// Run serves every pool until ctx ends.
func (in *Intake) Run(ctx context.Context) error {
	in.Clock = clock.Or(in.Clock)
	if in.LeaseTTL <= 0 {
		in.LeaseTTL = DefaultLeaseTTL
	}
	if in.Sets == nil {
		in.Sets = &Sets{}
	}
	if in.Metrics == nil {
		in.Metrics = &Metrics{}
	}
	var wg sync.WaitGroup
	for _, pool := range in.Pools {
		wg.Go(func() { in.serve(ctx, pool) })
	}
	wg.Wait()
	return ctx.Err()
}

// wait sleeps d on the intake's clock; false when ctx ended.
func (in *Intake) wait(ctx context.Context, d time.Duration) bool {
	t := in.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

// serve is one pool's life: its labels from the fold, its scale set, then
// the lease and the session in turn until ctx ends.
func (in *Intake) serve(ctx context.Context, pool string) {
	log := in.Logger.With("pool", pool, "scale_set", pool)
	var set *scaleset.RunnerScaleSet
	for set == nil {
		labels := in.labels(ctx, pool)
		if labels == nil {
			if !in.wait(ctx, 500*time.Millisecond) {
				return
			}
			continue
		}
		in.Sets.expect(labels)
		s, err := in.ensure(ctx, pool, labels)
		if err != nil {
			log.Warn("scale set not ready; trying again", "err", err)
			if !in.wait(ctx, 2*time.Second) {
				return
			}
			continue
		}
		set = s
		in.Sets.put(labels, s.ID)
	}
	l := &lease{kv: in.KV, key: pool, owner: in.Owner, ttl: in.LeaseTTL, clk: in.Clock}
	// One reconciler for the pool's whole life, not per session: what it
	// learnt (runs searched, runners seen idle, the last statistics)
	// outlives the sessions GitHub ends every so often.
	rec := newReconciler(in, set, log)
	backoff := 200 * time.Millisecond
	for ctx.Err() == nil {
		held, err := l.tryAcquire(ctx)
		if err != nil {
			log.Warn("scale set lease unreadable", "err", err)
		}
		if !held {
			// A standby looks every ttl/6: the holder renews every
			// ttl/3, so a dead holder's set is taken over within
			// ttl + 2 looks of its last renewal (8 s at the default
			// 6 s), and GitHub's queue waits no longer than that.
			if !in.wait(ctx, in.LeaseTTL/6) {
				return
			}
			continue
		}
		log.Info("scale set lease held", "owner", in.Owner, "last_message_id", l.record().LastMessageID)
		began := in.Clock.Now()
		err = in.hold(ctx, set, l, rec, log)
		if errors.Is(err, ErrLeaseLost) || in.Clock.Now().Sub(began) > 2*backoff {
			backoff = 200 * time.Millisecond // lost to another, or it served a while: not a failing loop
		}
		if errors.Is(err, ErrLeaseLost) {
			log.Info("scale set lease lost to another replica")
			continue
		}
		if ctx.Err() == nil {
			log.Warn("scale set session ended; opening another", "err", err, "after", backoff)
			if !in.wait(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, 10*time.Second)
		}
	}
}

// labels is the pool's runner labels from the fold, nil until a host
// advertises the pool.
func (in *Intake) labels(ctx context.Context, pool string) []string {
	var out []string
	_ = in.Read(ctx, func(f *events.Fleet) { out = slices.Clone(f.PoolLabels()[pool]) })
	return out
}

// ensure finds the pool's scale set by name in the runner group, creating
// it, or updating its labels when they differ.
func (in *Intake) ensure(ctx context.Context, pool string, labels []string) (*scaleset.RunnerScaleSet, error) {
	group, err := in.Client.GetRunnerGroupByName(ctx, cmpOr(in.RunnerGroup, scaleset.DefaultRunnerGroup))
	if err != nil {
		return nil, fmt.Errorf("runner group %q: %w", in.RunnerGroup, err)
	}
	want := &scaleset.RunnerScaleSet{Name: pool, RunnerGroupID: group.ID, Labels: labelList(labels)}
	have, err := in.Client.GetRunnerScaleSet(ctx, group.ID, pool)
	switch {
	case err != nil:
		return nil, fmt.Errorf("find scale set %s: %w", pool, err)
	case have == nil:
		return in.Client.CreateRunnerScaleSet(ctx, want)
	case !sameLabels(have.Labels, labels):
		return in.Client.UpdateRunnerScaleSet(ctx, have.ID, want)
	}
	return have, nil
}

func labelList(labels []string) []scaleset.Label {
	out := make([]scaleset.Label, 0, len(labels))
	for _, l := range labels {
		out = append(out, scaleset.Label{Name: l, Type: "System"})
	}
	return out
}

func sameLabels(have []scaleset.Label, want []string) bool {
	var names []string
	for _, l := range have {
		names = append(names, l.Name)
	}
	return events.LabelKey(names) == events.LabelKey(want)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// hold runs while the lease is ours: it renews it, opens the session and
// polls. It returns ErrLeaseLost when another replica took the set, or the
// error that broke the session.
func (in *Intake) hold(ctx context.Context, set *scaleset.RunnerScaleSet, l *lease, rec *reconciler, log *slog.Logger) error {
	hctx, cancel := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(nil); wg.Wait() }()
	wg.Go(func() {
		for in.wait(hctx, in.LeaseTTL/3) {
			if err := l.renew(hctx); err != nil {
				cancel(err)
				return
			}
		}
	})
	sess, err := in.open(hctx, set, l, log)
	if err != nil {
		return cause(hctx, err)
	}
	defer func() {
		// Close only while the lease is ours: a successor's session must
		// not be deleted by us, and a session we leave behind costs the
		// successor one 409 and a delete.
		if context.Cause(hctx) == nil || errors.Is(context.Cause(hctx), context.Canceled) {
			cctx, c := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = sess.Close(cctx)
			c()
		}
	}()
	// A new session carries the set's statistics: with every message
	// after a lost JobAssigned empty or lost too, they are the only news
	// of the job the fold is missing.
	if st := sess.Session().Statistics; st != nil {
		rec.round(hctx, st)
	}
	for {
		if err := in.poll(hctx, sess, l, rec); err != nil {
			return cause(hctx, err)
		}
	}
}

// cause prefers why hctx ended (ErrLeaseLost) over the call's own error.
func cause(hctx context.Context, err error) error {
	if c := context.Cause(hctx); c != nil && !errors.Is(c, context.Canceled) {
		return c
	}
	return err
}

// open opens the set's message session and records its id. A 409 means a
// session is still open: the one a dead holder left (its id is in the
// record), which it deletes before trying again with back-off.
func (in *Intake) open(ctx context.Context, set *scaleset.RunnerScaleSet, l *lease, log *slog.Logger) (*scaleset.MessageSessionClient, error) {
	backoff := 250 * time.Millisecond
	for {
		sess, err := in.Client.MessageSessionClient(ctx, set.ID, in.Owner)
		if err == nil {
			id := sess.Session().SessionID.String()
			if err := l.write(ctx, func(r *Record) { r.SessionID, r.ScaleSetID = id, set.ID }); err != nil {
				cctx, c := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				_ = sess.Close(cctx)
				c()
				return nil, err
			}
			in.Metrics.add(&in.Metrics.Sessions, 1)
			log.Info("scale set session opened", "session", id)
			return sess, nil
		}
		if !strings.Contains(err.Error(), "409") {
			return nil, err
		}
		stale := l.record().SessionID
		log.Warn("scale set has another session open; deleting the stale one", "stale_session", stale, "after", backoff)
		if stale != "" && in.Stale != nil {
			if derr := in.Stale.DeleteSession(ctx, set.ID, stale); derr != nil {
				log.Warn("stale session not deleted", "err", derr)
			}
		}
		if !in.wait(ctx, backoff) {
			return nil, ctx.Err()
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// capacityCheck is how often a long poll's capacity is compared with the
// fold's.
const capacityCheck = 250 * time.Millisecond

// longPoll is GetMessage with capacity sent, cut short (no message, no
// error) when the fold's capacity rises above it: GitHub assigns within
// the capacity of the poll it holds, so a slot freed during a 50 s poll
// would otherwise wait for the next one. Cutting a poll loses nothing: a
// message is consumed only by its delete.
func (in *Intake) longPoll(ctx context.Context, sess *scaleset.MessageSessionClient, last, capacity int, pool string) (*scaleset.RunnerScaleSetMessage, error) {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	risen := make(chan struct{})
	go func() {
		t := in.Clock.NewTicker(capacityCheck)
		defer t.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-t.C():
			}
			now := capacity
			if err := in.Read(pctx, func(f *events.Fleet) { now = Capacity(f, pool) }); err == nil && now > capacity {
				close(risen)
				cancel()
				return
			}
		}
	}()
	msg, err := sess.GetMessage(pctx, last, capacity)
	select {
	case <-risen:
		if err != nil {
			return nil, nil
		}
	default:
	}
	return msg, err
}

// poll reads one message with the fleet's capacity and handles it: its
// facts are stored and its jobs acquired, then the cursor is saved, then
// the message is deleted. Any failure before the cursor is saved returns
// without deleting it, so GitHub hands it out again.
func (in *Intake) poll(ctx context.Context, sess *scaleset.MessageSessionClient, l *lease, rec *reconciler) error {
	capacity := 0
	if err := in.Read(ctx, func(f *events.Fleet) { capacity = Capacity(f, rec.pool) }); err != nil {
		return err
	}
	in.Metrics.setCapacity(rec.pool, capacity)
	last := l.record().LastMessageID
	msg, err := in.longPoll(ctx, sess, last, capacity, rec.pool)
	if err != nil {
		return err
	}
	if msg == nil {
		rec.round(ctx, nil)
		return nil
	}
	facts, acquire, skipped := Facts(msg, in.Installation)
	in.Metrics.add(&in.Metrics.Skipped, skipped)
	for _, p := range facts {
		c, err := in.Log.AppendConfirmed(ctx, in.Log.New(in.Clock.Now(), p), nil)
		if err != nil {
			return fmt.Errorf("store a fact of message %d (it will be read again): %w", msg.MessageID, err)
		}
		rec.stored = max(rec.stored, c.Seq)
		in.Metrics.add(&in.Metrics.Facts, 1)
	}
	if len(acquire) > 0 {
		if _, err := sess.AcquireJobs(ctx, acquire); err != nil {
			return fmt.Errorf("acquire jobs of message %d (it will be read again): %w", msg.MessageID, err)
		}
	}
	if msg.MessageID > last {
		if err := l.write(ctx, func(r *Record) { r.LastMessageID = msg.MessageID }); err != nil {
			return err
		}
	}
	if err := sess.DeleteMessage(ctx, msg.MessageID); err != nil {
		rec.log.Debug("message not deleted; the cursor skips it", "message", msg.MessageID, "err", err)
	}
	in.Metrics.add(&in.Metrics.Messages, 1)
	rec.seen(msg)
	rec.round(ctx, msg.Statistics)
	return nil
}
