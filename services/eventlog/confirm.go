package eventlog

import (
	"context"
	"crypto/hmac"
	cryptorand "crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/berth-ci/berth/events"
)

// Confirmed is one fact's append once a duplicate answer was read back and
// judged (AppendConfirmed): the event as stored (its id may be a fresh one,
// retakenID), its stream sequence, whether the log already held it, and how
// many ids were found holding another fact on the way. Err is set only by
// AppendAllConfirmed.
type Confirmed struct {
	Event events.Event
	Seq   uint64
	// Dup: the log already held this fact (our own retried publish, or
	// another author's version of the same transition, DupStands).
	Dup bool
	// Taken counts the ids found holding another fact (DupTaken), each
	// answered by appending again under a fresh id.
	Taken int
	Err   error
}

// maxRetakes bounds how many fresh ids one fact tries in one append when
// its id is found taken again and again.
const maxRetakes = 3

// ErrIDTaken: every id a fact tried in one append held another fact.
var ErrIDTaken = errors.New("the fact's id holds another fact")

// AppendConfirmed is Append whose duplicate answer is read back (issue 16,
// 17): JetStream deduplicates Nats-Msg-Id across the whole stream and any
// credential may send any id, so "duplicate" alone may name a fact another
// writer stored under our id, and ours was never stored. A duplicate is
// confirmed only when the fact stored at the answered sequence is ours (a
// retried publish) or another author's version of the same transition
// (JudgeDuplicate); one whose id holds something else is counted (Taken),
// logged with what differs, and ev is appended again, now, under a fresh
// id (retakenID), at most maxRetakes times, then ErrIDTaken.
//
// A fresh id is safe for every fact, because no fold keys a fact by its
// envelope id (events/apply.go folds the payload), and DupTaken means the
// fold got nothing of this transition from the stored one: it is of
// another type or another aggregate instance, or refused where it stands
// (events.Authorize). A release in particular is then applied once
// (events.Attempt.Releases counts distinct stored releases); a release of
// the same attempt by another author is DupStands and is not repeated.
// expectSeq is Append's: each retry is checked against it again.
func (a *Appender) AppendConfirmed(ctx context.Context, ev events.Event, expectSeq *uint64) (Confirmed, error) {
	seq, dup, err := a.Append(ctx, ev, expectSeq)
	if err != nil || !dup {
		return Confirmed{Event: ev, Seq: seq}, err
	}
	return a.judge(ctx, ev, expectSeq, seq)
}

// AppendAllConfirmed is AppendAll with each duplicate answer confirmed as
// AppendConfirmed does (one at a time, after the batch): the outcomes in
// the order given, each with its error.
func (a *Appender) AppendAllConfirmed(ctx context.Context, evs []events.Event) []Confirmed {
	out := make([]Confirmed, len(evs))
	for i, r := range a.AppendAll(ctx, evs) {
		out[i] = Confirmed{Event: evs[i], Seq: r.Seq, Err: r.Err}
		if r.Err == nil && r.Dup {
			out[i], out[i].Err = a.judge(ctx, evs[i], nil, r.Seq)
		}
	}
	return out
}

// judge reads back the fact stored at seq, which the server answered ev's
// append with as a duplicate, and decides as AppendConfirmed says.
func (a *Appender) judge(ctx context.Context, ev events.Event, expect *uint64, seq uint64) (Confirmed, error) {
	base := ev.ID
	c := Confirmed{Event: ev, Seq: seq}
	for try := 0; ; try++ {
		if try > 0 {
			var dup bool
			var err error
			c.Seq, dup, err = a.Append(ctx, c.Event, expect)
			if err != nil || !dup {
				return c, err
			}
		}
		stored, rerr := a.ReadBack(ctx, c.Seq)
		if errors.Is(rerr, ErrNoReadBack) {
			// An agent reads only its own subjects: what it cannot read
			// there is another writer's, holding our id (issue 16).
			stored, rerr = a.ReadBackOwn(ctx, ev.Subject, c.Seq)
		}
		held := errors.Is(rerr, ErrHeldElsewhere)
		if !held && stored.Data == nil && rerr != nil && !errors.Is(rerr, events.ErrUnknownType) && !errors.Is(rerr, events.ErrMalformed) {
			return Confirmed{Event: c.Event, Taken: c.Taken}, fmt.Errorf("duplicate of %s not read back: %w", c.Event.ID, rerr)
		}
		verdict, diff := JudgeDuplicate(c.Event, stored, rerr)
		if held {
			verdict, diff = DupTaken, rerr.Error()
		}
		if verdict != DupTaken {
			if verdict == DupStands {
				a.logger().Debug("duplicate: another author stored this transition", "event", c.Event.ID, "seq", c.Seq, "differs", diff)
			}
			c.Dup = true
			return c, nil
		}
		c.Taken++
		if try == maxRetakes {
			return Confirmed{Event: c.Event, Taken: c.Taken}, fmt.Errorf("%w: %s (last at seq %d): another writer holds its ids; try again", ErrIDTaken, base, c.Seq)
		}
		fresh := a.retakenID(base, c.Seq)
		a.logger().Warn("duplicate answer, but another fact holds the id; appending under a fresh id",
			"event", c.Event.ID, "seq", c.Seq, "type", ev.Type(), "differs", diff, "fresh", fresh)
		c.Event.ID = fresh
	}
}

// retakenID is the id a fact is appended under when its own id holds
// another fact, stored at seq: id + "#" + seq + "." + a keyed hash of both
// under this process's secret and the appender's source. The first id of a fact is deterministic (a
// publish retried after a crash is deduplicated by the server), so another
// role can take it first by storing anything under it on its own subject:
// JetStream deduplicates Nats-Msg-Id across the whole stream. With a
// predictable retake (id#seq, the seq of its own decoy) it could take the
// whole chain and hold a release until the duplicate window ran out; this
// one it cannot predict. It is the same for every retry within this
// process, so those are still deduplicated; another replica retakes under
// its own, and the slot ledger's expected-sequence check refuses the second
// booking or release (every other fact folds idempotently).
func (a *Appender) retakenID(id string, seq uint64) string {
	m := hmac.New(sha256.New, retakeSecret[:])
	m.Write([]byte(a.Source))
	m.Write([]byte{0})
	m.Write([]byte(id))
	m.Write([]byte{0})
	m.Write([]byte(strconv.FormatUint(seq, 10)))
	return id + "#" + strconv.FormatUint(seq, 10) + "." + hex.EncodeToString(m.Sum(nil)[:8])
}

// retakeSecret keys retakenID: random per process, so no other writer can
// predict a retaken id.
var retakeSecret = func() (b [16]byte) {
	_, _ = cryptorand.Read(b[:])
	return b
}()

func (a *Appender) logger() *slog.Logger {
	if a.Logger != nil {
		return a.Logger
	}
	return slog.Default()
}
