package eventlog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/clock"
	"github.com/berth-ci/berth/services/crashpoint"
)

// DefaultInFlightFor is how long an appended fact (or a call) is trusted to
// show up in the fold before a decision may ask for it again.
const DefaultInFlightFor = 10 * time.Second

// Shell is the act half every service embeds (STYLE.md: decide, evolve,
// act). It owns the service's fold and keeps it on the loop's goroutine:
// it folds deliveries (skipping and counting what it cannot read), saves
// and restores snapshots, remembers the facts it appended that have not
// come back through the log yet, appends ledger facts with the ledger's
// expected sequence, and executes a decide function's plan step by step.
// A service adds only its decide function and the calls only it can make.
//
// Every method except Read runs on the loop (from Apply, Decide or a
// function given to Loop.Post).
type Shell struct {
	Loop   *Loop
	Log    *Appender
	Clock  clock.Clock
	Logger *slog.Logger
	// Fold is the service's projection of the log.
	Fold *events.Fleet
	// InFlightFor bounds how long an appended fact counts as on its way;
	// 0 means DefaultInFlightFor.
	InFlightFor time.Duration
	// Crash names the crash points (crashpoint.Hit) around an append of a
	// fact type: [before, after]. Tests SIGKILL a service there.
	Crash map[string][2]string
	// Stored, when set, is told of each step whose fact this shell stored.
	Stored func(events.Step)
	// Skipped, when set, is told of each delivery the fold could not read
	// (an unknown type or version, a corrupt payload, a parked fact) or
	// refused (events.ErrForged).
	Skipped func(error)
	// BeforeFold, when set, sees each admitted fact just before it is
	// folded (the fold still as it was: what the fact changes).
	BeforeFold func(events.Event)
	// Refused, when set, is told of each fact refused because its subject
	// does not confirm its payload or its author (law 10).
	Refused func(events.Event, error)

	refused    uint64
	overclaims uint64
	mismatched uint64

	inflight map[string]time.Time // step key → when appended or called
	keyOf    map[string]string    // event id → step key, until folded
}

// NewShell builds a shell around an empty fold; a nil clock is the wall
// clock and a nil logger the default one.
func NewShell(loop *Loop, app *Appender, clk clock.Clock, logger *slog.Logger) *Shell {
	if logger == nil {
		logger = slog.Default()
	}
	clk = clock.Or(clk)
	if loop != nil && loop.Clock == nil {
		loop.Clock = clk
	}
	sh := &Shell{Loop: loop, Log: app, Clock: clk, Logger: logger, Fold: events.NewFleet(),
		inflight: map[string]time.Time{}, keyOf: map[string]string{}}
	if app != nil && app.Logger == nil {
		app.Logger = logger // it tells of ids another writer took
	}
	return sh
}

// Now is the shell's clock's time.
func (s *Shell) Now() time.Time { return s.Clock.Now() }

// Admit confirms a decoded delivery before anything reads it: its stored
// subject must be the one its payload implies, written by a role allowed
// to write its type, and an attempt's fact must stand on the host the fold
// holds the attempt on (events.Admit). A fact that fails is refused.
func (s *Shell) Admit(d Delivered) error {
	if d.Err != nil {
		return d.Err
	}
	_, err := events.Admit(s.Fold, d.Event)
	return err
}

// RefusedTotal counts the facts this shell refused since it started.
func (s *Shell) RefusedTotal() uint64 { return s.refused }

// MismatchedTotal counts the duplicate answers whose stored fact, read
// back, was not this shell's (DupTaken) since it started.
func (s *Shell) MismatchedTotal() uint64 { return s.mismatched }

// Apply folds one delivery, or skips and counts one the fold cannot read,
// refuses (counts, parks, alarms on) one its subject does not confirm, and
// forgets the in-flight mark of a fact that has come back.
func (s *Shell) Apply(d Delivered) {
	if d.Err == nil {
		if err := s.Admit(d); err != nil {
			s.refuse(d, err)
			return
		}
	} else if errors.Is(d.Err, events.ErrMalformed) {
		// Bytes that are no Berth envelope were written by a credential
		// that can publish there: not a newer version to skip quietly, a
		// misuse to count, park and alarm on like a forged fact.
		s.refuse(d, fmt.Errorf("%w: %v", events.ErrForged, d.Err))
		return
	}
	if d.Err != nil {
		if s.Skipped != nil {
			s.Skipped(d.Err)
		}
		s.Logger.Warn("skipping event", "seq", d.Event.Seq, "subject", d.Event.Subject, "err", d.Err)
		s.Fold.Skip(d.Event.Seq, d.Event.Subject)
		return
	}
	if s.BeforeFold != nil {
		s.BeforeFold(d.Event)
	}
	s.Fold.Apply(d.Event)
	s.checkClaim(d)
	key, ok := s.keyOf[d.Event.ID]
	if !ok {
		key = d.Event.ID
	}
	delete(s.keyOf, d.Event.ID)
	delete(s.inflight, key)
}

// checkClaim counts and parks a host announcement the fold holds beyond
// the host's grant (events.Offer): folded, but offered only within it.
func (s *Shell) checkClaim(d Delivered) {
	o, ok := d.Event.Data.(*events.HostOnline)
	if !ok {
		return
	}
	h := s.Fold.Hosts[o.Host]
	if h == nil || len(h.Overclaim) == 0 {
		return
	}
	s.overclaims++
	if s.Loop != nil {
		s.Loop.Overclaim(d, fmt.Errorf("host %s claims more than its grant: %s; grant it if it is right: %s",
			o.Host, strings.Join(h.Overclaim, "; "), events.OverclaimCommand(o.Host)))
	}
}

// OverclaimTotal counts the host announcements beyond their grant this
// shell folded since it started.
func (s *Shell) OverclaimTotal() uint64 { return s.overclaims }

// refuse never folds a forged fact; the fold still moves past its
// sequence (a ledger's too, or every later booking there would conflict).
func (s *Shell) refuse(d Delivered, err error) {
	s.refused++
	if s.Loop != nil {
		s.Loop.Refuse(d, err)
	}
	if s.Skipped != nil {
		s.Skipped(err)
	}
	if s.Refused != nil {
		s.Refused(d.Event, err)
	}
	s.Fold.Skip(d.Event.Seq, d.Event.Subject)
}

// SaveFold implements Snapshotter.
func (s *Shell) SaveFold() (func(io.Writer) error, uint64, error) {
	z, err := events.FreezeSnapshot(s.Fold)
	if err != nil {
		return nil, 0, err
	}
	return z.Encode, s.Fold.LastSeq, nil
}

// RestoreFold implements Snapshotter (called before the loop runs). The
// restored fold keeps delivery ids and sealed JIT configs only if the one
// it replaces did.
func (s *Shell) RestoreFold(b []byte) (uint64, error) {
	f, err := events.UnmarshalSnapshot(b)
	if err != nil {
		return 0, err
	}
	if !s.Fold.KeepsDeliveryIDs() {
		f.DropDeliveryIDs()
	}
	if !s.Fold.KeepsSealedJIT() {
		f.DropSealedJIT()
	}
	s.Fold = f
	return f.LastSeq, nil
}

// Read runs fn on the loop with the fold and waits for it, up to ctx: the
// safe way for health, status and tests to look at the live projection.
// fn must not keep the fold.
func (s *Shell) Read(ctx context.Context, fn func(*events.Fleet)) error {
	done := make(chan struct{})
	s.Loop.Post(ctx, func() {
		fn(s.Fold)
		close(done)
	})
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("the loop did not answer: %w", ctx.Err())
	}
}

// InFlight reports whether key was appended or called less than
// InFlightFor ago and has not come back through the fold.
func (s *Shell) InFlight(key string) bool {
	at, ok := s.inflight[key]
	return ok && s.Now().Sub(at) < s.inFlightFor()
}

// MarkInFlight records that key is on its way (a call started, a fact
// appended), so decisions in the meantime do not ask for it again.
func (s *Shell) MarkInFlight(key string) { s.inflight[key] = s.Now() }

// Forget drops key's in-flight mark: the call ended without a fact, and
// the next decision may ask for it again.
func (s *Shell) Forget(key string) { delete(s.inflight, key) }

// appendFailed logs an append that failed and records it as a fault of
// NATS (Loop.NoteFault); a conflict (the fold is behind its ledger) is
// neither: the round decides again on the fresher fold.
func (s *Shell) appendFailed(id string, err error) {
	if errors.Is(err, ErrConflict) {
		return
	}
	s.Loop.NoteFault(s.Now())
	s.Logger.Warn("append failed; the next round decides it again", "event", id, "err", err)
}

// Housekeep drops in-flight marks older than InFlightFor, so a fact that
// was lost on its way is decided again and the maps stay flat (law 5).
func (s *Shell) Housekeep() {
	now, ttl := s.Now(), s.inFlightFor()
	for key, at := range s.inflight {
		if now.Sub(at) >= ttl {
			delete(s.inflight, key)
		}
	}
	for id, key := range s.keyOf {
		if _, ok := s.inflight[key]; !ok {
			delete(s.keyOf, id)
		}
	}
}

func (s *Shell) inFlightFor() time.Duration {
	if s.InFlightFor > 0 {
		return s.InFlightFor
	}
	return DefaultInFlightFor
}

// Append appends one fact as a plan step would (ledger-aware, skipped
// while in flight).
func (s *Shell) Append(ctx context.Context, p events.Payload) error {
	_, err := s.appendStep(ctx, events.Fact(p))
	return err
}

// Execute carries out a plan in order. Facts are appended (a ledger fact
// with its ledger's expected sequence; once a ledger conflicts, its later
// steps wait for the next round, which decides again on a fresh fold);
// calls are handed to call. A failed append is logged and decided again
// next round: every decision derives from the fold (law 11).
func (s *Shell) Execute(ctx context.Context, plan events.Plan, call func(context.Context, events.Call)) {
	s.execute(ctx, plan, call, map[string]bool{})
}

func (s *Shell) execute(ctx context.Context, plan events.Plan, call func(context.Context, events.Call), conflicted map[string]bool) {
	for i := 0; i < len(plan); i++ {
		st := plan[i]
		if n := s.batchable(plan[i:]); n > 1 {
			s.appendBatch(ctx, plan[i:i+n])
			i += n - 1
			continue
		}
		if st.Call != nil {
			if call != nil {
				call(ctx, st.Call)
			}
			continue
		}
		ledger, isLedger := events.LedgerOf(st.Fact)
		if isLedger && conflicted[ledger] {
			continue
		}
		stored, err := s.appendStep(ctx, st)
		if errors.Is(err, ErrConflict) {
			conflicted[ledger] = true // the fold is behind the ledger: re-read, decide again
			continue
		}
		if err != nil {
			continue
		}
		if stored && st.Msg != "" {
			s.Logger.Log(ctx, st.Level, st.Msg, st.Attrs...)
		}
		if stored && s.Stored != nil {
			s.Stored(st)
		}
		s.execute(ctx, st.Then, call, conflicted)
	}
}

// batchable is how many steps from the start of plan can be appended as
// one batch (AppendAll): facts checked against no ledger's sequence, with
// nothing to run after them and no crash point around them (a crash test
// needs one append at a time).
func (s *Shell) batchable(plan events.Plan) int {
	n := 0
	for _, st := range plan {
		if st.Fact == nil || len(st.Then) > 0 {
			break
		}
		if _, ledger := events.LedgerOf(st.Fact); ledger {
			break
		}
		if p := s.Crash[st.Fact.EventType()]; p[0] != "" || p[1] != "" {
			break
		}
		n++
	}
	return n
}

// appendBatch appends steps' facts (batchable ones) published together and
// awaited together, skipping those in flight. A duplicate answer is read
// back and judged as Append's is (store); a failed append is logged and
// decided again next round.
func (s *Shell) appendBatch(ctx context.Context, steps events.Plan) {
	evs := make([]events.Event, 0, len(steps))
	keys := make([]string, 0, len(steps))
	todo := make([]events.Step, 0, len(steps))
	seen := make(map[string]struct{}, len(steps))
	for _, st := range steps {
		ev := s.Log.New(s.Now(), st.Fact)
		key := st.Key
		if key == "" {
			key = ev.ID
		}
		if _, twice := seen[key]; twice || s.InFlight(key) {
			continue // on its way, or twice in this plan: appended once
		}
		seen[key] = struct{}{}
		evs, keys, todo = append(evs, ev), append(keys, key), append(todo, st)
	}
	if len(evs) == 0 {
		return
	}
	for i, c := range s.Log.AppendAllConfirmed(ctx, evs) {
		s.countTaken(c.Taken)
		if c.Err != nil {
			s.appendFailed(c.Event.ID, c.Err)
			continue
		}
		s.stored(ctx, todo[i], c.Event, keys[i], c.Seq, c.Dup)
	}
}

// stored records a step whose fact the log holds (in flight until it
// comes back through the fold) and tells who wants to know.
func (s *Shell) stored(ctx context.Context, st events.Step, ev events.Event, key string, seq uint64, dup bool) {
	s.inflight[key] = s.Now()
	if key != ev.ID {
		s.keyOf[ev.ID] = key
	}
	s.Logger.Debug("appended", "event", ev.ID, "type", ev.Type(), "seq", seq, "duplicate", dup)
	if dup {
		return
	}
	if st.Msg != "" {
		s.Logger.Log(ctx, st.Level, st.Msg, st.Attrs...)
	}
	if s.Stored != nil {
		s.Stored(st)
	}
}

// appendStep appends st's fact unless it is in flight. stored is true only
// when this call stored it (not a duplicate, not skipped).
func (s *Shell) appendStep(ctx context.Context, st events.Step) (stored bool, err error) {
	ev := s.Log.New(s.Now(), st.Fact)
	key := st.Key
	if key == "" {
		key = ev.ID
	}
	if s.InFlight(key) {
		return false, nil
	}
	points := s.Crash[ev.Type()]
	hit(points[0])
	var expect *uint64
	ledger, isLedger := events.LedgerOf(st.Fact)
	if isLedger {
		var last uint64
		if l := s.Fold.Pools[ledger]; l != nil {
			last = l.LastSeq
		}
		expect = &last
	}
	ev, seq, dup, err := s.store(ctx, ev, expect)
	if err != nil {
		s.appendFailed(ev.ID, err)
		return false, err
	}
	hit(points[1])
	s.inflight[key] = s.Now()
	if key != ev.ID {
		s.keyOf[ev.ID] = key
	}
	if isLedger && !dup {
		s.foldOwn(ev, seq)
	}
	s.Logger.Debug("appended", "event", ev.ID, "type", ev.Type(), "seq", seq, "duplicate", dup)
	return !dup, nil
}

// store appends ev, and reads a duplicate answer back
// (Appender.AppendConfirmed): stored means read back (issue 17). It returns
// the event as stored (its id may be a fresh one).
func (s *Shell) store(ctx context.Context, ev events.Event, expect *uint64) (events.Event, uint64, bool, error) {
	c, err := s.Log.AppendConfirmed(ctx, ev, expect)
	s.countTaken(c.Taken)
	return c.Event, c.Seq, c.Dup, err
}

// countTaken counts ids found held by another fact.
func (s *Shell) countTaken(n int) {
	s.mismatched += uint64(n)
	if s.Loop != nil {
		s.Loop.mismatched.Add(uint64(n))
	}
}

func hit(point string) {
	if point != "" {
		crashpoint.Hit(point)
	}
}

// foldOwn folds a ledger fact this shell just stored, before it comes back
// through the consumer. The expected-sequence check proved nothing else
// reached the ledger in between, so the fold then holds the whole ledger up
// to seq and the next booking, in this round or the next, both counts this
// one and chains onto it. (Chaining the sequence without folding the fact
// let a booking through on a fold that did not count the one before it:
// over-booking.) Not on a duplicate: the fact stored under this id may be
// another writer's, with other contents; the fold learns it from the log.
// The fold is idempotent, so the delivery that follows changes nothing.
func (s *Shell) foldOwn(ev events.Event, seq uint64) {
	b, err := events.Marshal(ev)
	if err != nil {
		return
	}
	stored, err := events.Unmarshal(b, seq) // the payload as the log gives it back
	if err != nil {
		return
	}
	stored.Seq, stored.Subject = seq, ev.Subject
	s.Fold.Apply(stored)
}
