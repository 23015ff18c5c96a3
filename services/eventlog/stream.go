package eventlog

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// MaxConsumers is how many consumers the log allows. Every host's agent
// holds two (its durable consumer and the watch on its own host subject),
// every service one, every `berth events -f` or `status --watch` one. The
// server's default of 1,000 per stream stopped agents from starting past
// about 495 hosts (found by the bench's 500-host scale run).
const MaxConsumers = 10_000

// StreamConfig is what Berth asks of its one stream.
//
// MaxAge, MaxBytes and MaxMsgs bound the log under limits retention: the
// server drops the oldest facts once any limit is passed (0: no limit).
// Services come back right after a restart only while their snapshots in
// events.BucketSnapshots cover what was dropped, which is why config validates the
// limits against the snapshot interval and the watchdog's deadlines.
type StreamConfig struct {
	Replicas int // 1 for one server, 3 on a cluster
	// DuplicateWindow is how long the server remembers Nats-Msg-Id; 0 means
	// DefaultDuplicateWindow, or MaxAge when that is shorter. It may not
	// exceed MaxAge.
	DuplicateWindow time.Duration
	MaxAge          time.Duration // facts older than this are dropped; NATS accepts >= 100ms
	MaxBytes        int64         // the stream's size in bytes at most
	MaxMsgs         int64         // the number of facts at most
}

// Connect dials NATS with reconnects forever, so a restarting server is
// waited for rather than fatal. Services add WaitForServer so that one
// started before its server waits for it; tools fail fast instead.
func Connect(url, name string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	base := []nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond)}
	nc, err := nats.Connect(url, append(base, opts...)...)
	if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAuthRevoked) {
		return nil, nil, fmt.Errorf("connect to NATS at %s: %w (this server wants a credential: pass --nats-nkey with the role's seed from berth nats-auth, e.g. cli.nk, or set nats.nkey_file in the config)", url, err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("connect to NATS at %s: %w (is nats-server running? `berth dev` embeds one)", url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}

// WaitForServer makes the first connect wait for a server that is not up
// yet (compose, systemd) instead of failing.
var WaitForServer = nats.RetryOnFailedConnect(true)

// EnsureStream creates BERTH_EVENTS or updates an existing one in place to
// cfg (limits included: lowering one drops the oldest facts at once). It
// is the admin's step (`berth stream apply`, Apply) and the tests'; a
// service only verifies the stream (VerifyStream) and never changes it. No
// fact is ever deleted or purged by hand (both are denied); only the
// retention limits drop the oldest ones. Storage is on file.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, error) {
	sc, err := cfg.Settings()
	if err != nil {
		return nil, err
	}
	// Update only what differs: a stream update racing a consumer's
	// creation is a data race inside nats-server v2.15.2
	// (fileStore.UpdateConfig vs ConsumerStore, seen under -race), and an
	// update nobody needs is churn on a cluster.
	if cur, err := js.Stream(ctx, events.StreamName); err == nil && sameStream(cur.CachedInfo().Config, sc) {
		return cur, nil
	}
	s, err := js.CreateOrUpdateStream(ctx, sc)
	if err != nil {
		return nil, fmt.Errorf("create stream %s: %w", events.StreamName, err)
	}
	return s, nil
}

// Settings is the server's stream configuration for cfg, with its
// defaults filled in, or an error for limits that cannot hold.
func (cfg StreamConfig) Settings() (jetstream.StreamConfig, error) {
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.MaxAge < 0 || cfg.MaxBytes < 0 || cfg.MaxMsgs < 0 {
		return jetstream.StreamConfig{}, fmt.Errorf("stream %s: negative limit (max age %v, max bytes %d, max msgs %d): use 0 for no limit",
			events.StreamName, cfg.MaxAge, cfg.MaxBytes, cfg.MaxMsgs)
	}
	if cfg.DuplicateWindow == 0 {
		cfg.DuplicateWindow = DefaultDuplicateWindow
		if cfg.MaxAge != 0 && cfg.MaxAge < cfg.DuplicateWindow {
			cfg.DuplicateWindow = cfg.MaxAge
		}
	}
	if cfg.MaxAge != 0 && cfg.DuplicateWindow > cfg.MaxAge {
		return jetstream.StreamConfig{}, fmt.Errorf("stream %s: duplicate window %v exceeds max age %v: a fact cannot be deduplicated after it expired; shorten the window",
			events.StreamName, cfg.DuplicateWindow, cfg.MaxAge)
	}
	// The server counts -1 as "no limit" for messages and bytes.
	unlimited := func(v int64) int64 {
		if v == 0 {
			return -1
		}
		return v
	}
	return jetstream.StreamConfig{
		Name:        events.StreamName,
		Description: "Berth event log: every fact about jobs, slots, attempts and hosts",
		Subjects:    []string{events.SubjectAll},
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		Duplicates:  cfg.DuplicateWindow,
		DenyDelete:  true,
		DenyPurge:   true,
		AllowDirect: true,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      cfg.MaxAge,
		MaxBytes:    unlimited(cfg.MaxBytes),
		MaxMsgs:     unlimited(cfg.MaxMsgs),
		// Set, or the server's default applies: 1,000 consumers per
		// stream since nats-server 2.10 (-1 does not opt out of it).
		MaxConsumers: MaxConsumers,
	}, nil
}

// sameStream compares the settings EnsureStream asks for.
func sameStream(a, b jetstream.StreamConfig) bool {
	return a.Description == b.Description && slices.Equal(a.Subjects, b.Subjects) && a.Storage == b.Storage &&
		a.Replicas == b.Replicas && a.Duplicates == b.Duplicates && a.DenyDelete == b.DenyDelete &&
		a.DenyPurge == b.DenyPurge && a.AllowDirect == b.AllowDirect && a.Retention == b.Retention &&
		a.Discard == b.Discard && a.MaxAge == b.MaxAge && a.MaxBytes == b.MaxBytes && a.MaxMsgs == b.MaxMsgs &&
		a.MaxConsumers == b.MaxConsumers
}

// ErrConflict is returned by Append when the aggregate's subject moved past
// the expected sequence: another writer got there first. Re-read and decide
// again.
var ErrConflict = errors.New("optimistic concurrency conflict")

// DefaultDuplicateWindow is how long the server deduplicates Nats-Msg-Id
// unless the config says (nats.duplicate_window). It covers what a retried
// append needs: each publish waits at most Appender.Timeout (5 s) and a
// failed one is decided again at the next round, a NATS leader election
// included. A fact stored twice after the window is harmless: every fold
// tolerates duplicates (DESIGN.md's contracts), which a webhook
// redelivered days later needs anyway. The server keeps every id of the
// window in memory, about 150 bytes each: at 6,400 facts/s, JetStream's
// default of 2 minutes held 110 MiB of its heap, and 100,000-job
// throughput runs alternating 30 s with 2 minutes went 628–683 against
// 545–612 lifecycles/s (BENCHMARKS.md).
const DefaultDuplicateWindow = 30 * time.Second

// Appender writes facts to the log.
type Appender struct {
	JS     jetstream.JetStream
	Source string // CloudEvents source, e.g. "berth/dispatcher/host-a"
	// Role is the author every fact is written as: its token ends the
	// subject of a fact on an aggregate several roles write, and the NATS
	// permissions of the role's credential allow only that token. Every
	// service sets it; empty writes each fact as its type's first author
	// (tests and tools laying down a history).
	Role events.Role
	// Timeout bounds each publish and each read back (law 3); 0 means 5 s.
	Timeout time.Duration
	// NoReadBack: this appender's credential may not read the log by
	// sequence (an agent's may read only its own host's subjects,
	// services/natsauth), so a duplicate answer is read back from its own
	// subject (ReadBackOwn).
	NoReadBack bool
	// Logger hears of ids found held by another fact (AppendConfirmed);
	// nil is the default logger.
	Logger *slog.Logger
}

// Append stores one fact. The envelope id is the Nats-Msg-Id, so a retried
// append inside the duplicate window is stored once. When expectSeq is not
// nil the append succeeds only if the last sequence on the fact's subject is
// *expectSeq (0: the subject is empty); otherwise it returns ErrConflict.
// It returns the stream sequence and whether the server saw a duplicate.
//
// A subject whose facts have all expired under the stream's limits reads as
// empty to the server, while the caller's fold still knows the sequence of
// its last fact: the check would fail on every try, for ever. So on a
// conflict Append asks the server once: when the subject now holds nothing
// and *expectSeq is below the stream's first sequence (what the caller saw
// last has expired, and nothing written after it survives), it appends again
// expecting the subject empty, which is still atomic against any other
// writer. This assumes the caller's fold is not behind the stream's first
// sequence (config keeps the retention far longer than any service's lag).
func (a *Appender) Append(ctx context.Context, ev events.Event, expectSeq *uint64) (uint64, bool, error) {
	msg, opts, err := StoredMsg(ev)
	if err != nil {
		return 0, false, err
	}
	timeout := a.Timeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if expectSeq != nil {
		opts = append(opts, jetstream.WithExpectLastSequencePerSubject(*expectSeq))
	}
	filter := events.AggregateFilter(ev.Subject)
	if expectSeq != nil && filter != ev.Subject {
		// The aggregate spans one subject per author: the expected
		// sequence is the last of any of them (NATS 2.11+).
		msg.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, filter)
	}
	ack, err := a.JS.PublishMsg(ctx, msg, opts...)
	if expectSeq != nil && *expectSeq != 0 && wrongLastSeq(err) {
		if expired, xerr := subjectExpired(ctx, a.JS, filter, *expectSeq); xerr == nil && expired {
			opts[len(opts)-1] = jetstream.WithExpectLastSequencePerSubject(0)
			ack, err = a.JS.PublishMsg(ctx, msg, opts...)
		}
	}
	if err != nil {
		if wrongLastSeq(err) {
			return 0, false, fmt.Errorf("%w: %s on %s", ErrConflict, ev.ID, ev.Subject)
		}
		return 0, false, fmt.Errorf("append %s to %s: %w", ev.ID, ev.Subject, err)
	}
	return ack.Sequence, ack.Duplicate, nil
}

// Appended is one fact's outcome in AppendAll: its stream sequence and
// whether the server saw a duplicate, or the error.
type Appended struct {
	Seq uint64
	Dup bool
	Err error
}

// AppendAll stores facts that need no expected-sequence check, published
// together and awaited together (issue 19: one round trip for a round's
// facts, not one each). Each is stored once under its id, as with Append;
// NATS keeps one connection's publishes in order, so the log holds them
// in the order given. The outcomes are in the same order; the whole batch
// is bounded by Timeout (law 3).
func (a *Appender) AppendAll(ctx context.Context, evs []events.Event) []Appended {
	out := make([]Appended, len(evs))
	timeout := a.Timeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	acks := make([]jetstream.PubAckFuture, len(evs))
	for i, ev := range evs {
		msg, opts, err := StoredMsg(ev)
		if err != nil {
			out[i].Err = err
			continue
		}
		acks[i], out[i].Err = a.JS.PublishMsgAsync(msg, opts...)
	}
	for i, f := range acks {
		if f == nil {
			continue
		}
		select {
		case ack := <-f.Ok():
			out[i].Seq, out[i].Dup = ack.Sequence, ack.Duplicate
		case err := <-f.Err():
			out[i].Err = err
		case <-ctx.Done():
			out[i].Err = ctx.Err()
		}
		if out[i].Err != nil {
			out[i].Err = fmt.Errorf("append %s to %s: %w", evs[i].ID, evs[i].Subject, out[i].Err)
		}
	}
	return out
}

// StoredMsg is the message and the publish options a fact is stored
// with, by every writer (Append, AppendAll; the bench's synthetic logs
// too, so that they cost a reader what the services' facts cost): the
// CloudEvents envelope as the body, its MsgID as the Nats-Msg-Id, and
// BERTH_EVENTS as the expected stream. The server stores every header it
// is sent with the message, and a direct get rebuilds each header block
// it sends (nats-server's genHeader, once per header it adds), so a fact
// carries no header a reader does not need: its type is the envelope's
// "type" (a Ce-Type header repeated it until 2026-12-07). Publishing
// these options answers a duplicate, within the stream's window, with
// the first copy's sequence. It fails only when the payload cannot be
// encoded.
func StoredMsg(ev events.Event) (*nats.Msg, []jetstream.PublishOpt, error) {
	body, err := events.Marshal(ev)
	if err != nil {
		return nil, nil, err
	}
	msg := &nats.Msg{Subject: ev.Subject, Data: body, Header: nats.Header{}}
	return msg, []jetstream.PublishOpt{jetstream.WithMsgID(MsgID(ev)), jetstream.WithExpectStream(events.StreamName)}, nil
}

// MsgID is the Nats-Msg-Id a fact is stored under: its id, scoped to the
// subject it is stored on. The server deduplicates by this id across the
// whole stream, so an unscoped id let any credential squat another role's
// future fact ids (attempt ids are predictable) from a subject of its own,
// and the real fact was then answered "duplicate" and never stored. Scoped,
// a duplicate can only be the same author's retry on the same aggregate.
func MsgID(ev events.Event) string { return ev.Subject + "|" + ev.ID }

// wrongLastSeq reports whether err is the server refusing an expected
// last sequence.
func wrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// subjectExpired reports whether subject holds no fact any more and seq (the
// last one a caller saw on it) lies before the stream's first sequence: the
// subject's history expired under the retention limits rather than moved.
func subjectExpired(ctx context.Context, js jetstream.JetStream, subject string, seq uint64) (bool, error) {
	s, err := js.Stream(ctx, events.StreamName) // reads the stream's state: its first sequence
	if err != nil {
		return false, err
	}
	first := s.CachedInfo().State.FirstSeq
	if _, err := s.GetLastMsgForSubject(ctx, subject); !errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, err // a fact is there (err nil): a real conflict
	}
	return seq < first, nil
}

// ErrNoReadBack is returned by ReadBack when the appender may not read
// the log by sequence (Appender.NoReadBack).
var ErrNoReadBack = errors.New("this credential may not read the log back by sequence")

// Duplicate is what a duplicate answer turned out to be once the fact
// stored under the id was read back (JudgeDuplicate).
type Duplicate int

const (
	// DupSame: the stored fact is ours (same id, type, subject and
	// payload): a retried publish. Only its time and source may differ.
	DupSame Duplicate = iota
	// DupStands: another author's version of the same transition (same
	// type, same payload id, admitted where it is stored), e.g. the
	// watchdog's release of an attempt the dispatcher releases too. The
	// fold applies it as it would apply ours; appending ours as well would
	// apply the transition twice.
	DupStands
	// DupTaken: the id holds something else (another subject, another
	// transition, a fact its subject does not confirm, unreadable bytes):
	// ours is not stored, and the fold will never apply it from there.
	DupTaken
)

func (d Duplicate) String() string { return [...]string{"same", "stands", "taken"}[d] }

// ReadBack reads the fact the log holds at seq, the one a duplicate's ack
// names as stored first under the id, with the subject it is stored on,
// bounded by the appender's timeout (law 3). A fact this build cannot
// decode comes back with its decoding error.
func (a *Appender) ReadBack(ctx context.Context, seq uint64) (events.Event, error) {
	if a.NoReadBack {
		return events.Event{}, ErrNoReadBack
	}
	return a.read(ctx, seq, func(ctx context.Context, s jetstream.Stream) (*jetstream.RawStreamMsg, error) {
		return s.GetMsg(ctx, seq)
	})
}

// ErrHeldElsewhere: the fact stored under an id is not on the subject the
// appender wrote it to (ReadBackOwn), so it is not the appender's own.
var ErrHeldElsewhere = errors.New("the id is held by a fact on another subject")

// ReadBackOwn is ReadBack for a credential that may read only its own
// subjects (an agent): it reads the last fact on subject, where the
// appender stored the fact the duplicate answer names, and returns it when
// it is the one at seq. Otherwise the id is held by a fact elsewhere, which
// cannot be the appender's own (ErrHeldElsewhere): another writer took the
// id first. A retried publish whose first try was stored is the last fact
// on its subject, since the appender appends one fact at a time there.
func (a *Appender) ReadBackOwn(ctx context.Context, subject string, seq uint64) (events.Event, error) {
	m, err := LastOn(ctx, a.JS, subject) // a direct get: an agent may not read the stream's info
	if errors.Is(err, jetstream.ErrMsgNotFound) || (err == nil && m.Seq != seq) {
		return events.Event{}, fmt.Errorf("%w: seq %d is not the last fact on %s", ErrHeldElsewhere, seq, subject)
	}
	if err != nil {
		return events.Event{}, fmt.Errorf("read back seq %d: %w", seq, err)
	}
	ev, err := events.Unmarshal(m.Data, m.Seq)
	ev.Seq, ev.Subject = m.Seq, m.Subject
	ev.ClampToStored(m.Time)
	return ev, err
}

// read gets one stored message with get, bounded by the appender's
// timeout (law 3), and decodes it with its stored sequence and subject.
func (a *Appender) read(ctx context.Context, seq uint64, get func(context.Context, jetstream.Stream) (*jetstream.RawStreamMsg, error)) (events.Event, error) {
	timeout := a.Timeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	s, err := a.JS.Stream(ctx, events.StreamName)
	if err != nil {
		return events.Event{}, fmt.Errorf("read back seq %d: %w", seq, err)
	}
	m, err := get(ctx, s)
	if err != nil {
		return events.Event{}, fmt.Errorf("read back seq %d: %w", seq, err)
	}
	ev, err := events.Unmarshal(m.Data, m.Sequence)
	ev.Seq, ev.Subject = m.Sequence, m.Subject
	ev.ClampToStored(m.Time)
	return ev, err
}

// JudgeDuplicate compares ours with the fact stored under its id (read
// back, with its decoding error) and says what the duplicate is, and what
// differs (empty when nothing does). It is pure.
func JudgeDuplicate(ours, stored events.Event, decodeErr error) (Duplicate, string) {
	if decodeErr != nil || stored.Data == nil {
		return DupTaken, fmt.Sprintf("stored fact at seq %d on %s is unreadable: %v", stored.Seq, stored.Subject, decodeErr)
	}
	var diffs []string
	if stored.ID != ours.ID {
		diffs = append(diffs, fmt.Sprintf("id %q (ours %q)", stored.ID, ours.ID))
	}
	if stored.Type() != ours.Type() {
		diffs = append(diffs, fmt.Sprintf("type %s (ours %s)", stored.Type(), ours.Type()))
	}
	if stored.Subject != ours.Subject {
		diffs = append(diffs, fmt.Sprintf("subject %s (ours %s)", stored.Subject, ours.Subject))
	}
	sb, serr := json.Marshal(stored.Data)
	ob, oerr := json.Marshal(ours.Data)
	if serr != nil || oerr != nil || !bytes.Equal(sb, ob) {
		diffs = append(diffs, fmt.Sprintf("payload %s (ours %s)", sb, ob))
	}
	if len(diffs) == 0 {
		return DupSame, ""
	}
	diff := strings.Join(diffs, "; ")
	if _, err := events.Authorize(stored); err == nil && stored.Type() == ours.Type() &&
		stored.Data.EventID() == ours.Data.EventID() {
		return DupStands, diff
	}
	return DupTaken, diff
}

// New stamps a payload as a fact from this appender's source and role.
func (a *Appender) New(at time.Time, p events.Payload) events.Event {
	return events.NewBy(a.Source, a.Role, at, p)
}
