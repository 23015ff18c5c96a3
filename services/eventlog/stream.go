package eventlog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// StreamConfig is what Berth asks of its one stream.
type StreamConfig struct {
	Replicas        int           // 1 for one server, 3 on a cluster
	DuplicateWindow time.Duration // how long the server remembers Nats-Msg-Id; 0 means 2m
}

// Connect dials NATS with reconnects forever, so a restarting server is
// waited for rather than fatal. Services add WaitForServer so that one
// started before its server waits for it; tools fail fast instead.
func Connect(url, name string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	base := []nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond)}
	nc, err := nats.Connect(url, append(base, opts...)...)
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

// EnsureStream creates BERTH_EVENTS or updates it to cfg; it is safe to call
// from every service at every start. The log is immutable: delete and purge
// are denied, storage is on file.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, error) {
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.DuplicateWindow == 0 {
		cfg.DuplicateWindow = 2 * time.Minute
	}
	sc := jetstream.StreamConfig{
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
	}
	s, err := js.CreateOrUpdateStream(ctx, sc)
	if err != nil {
		return nil, fmt.Errorf("create stream %s: %w", events.StreamName, err)
	}
	return s, nil
}

// ErrConflict is returned by Append when the aggregate's subject moved past
// the expected sequence: another writer got there first. Re-read and decide
// again.
var ErrConflict = errors.New("optimistic concurrency conflict")

// Appender writes facts to the log.
type Appender struct {
	JS     jetstream.JetStream
	Source string // CloudEvents source, e.g. "berth/dispatcher/host-a"
	// Timeout bounds each publish (law 3); 0 means 5 s.
	Timeout time.Duration
}

// Append stores one fact. The envelope id is the Nats-Msg-Id, so a retried
// append inside the duplicate window is stored once. When expectSeq is not
// nil the append succeeds only if the last sequence on the fact's subject is
// *expectSeq (0: the subject is empty); otherwise it returns ErrConflict.
// It returns the stream sequence and whether the server saw a duplicate.
func (a *Appender) Append(ctx context.Context, ev events.Event, expectSeq *uint64) (uint64, bool, error) {
	body, err := events.Marshal(ev)
	if err != nil {
		return 0, false, err
	}
	timeout := a.Timeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	opts := []jetstream.PublishOpt{jetstream.WithMsgID(ev.ID), jetstream.WithExpectStream(events.StreamName)}
	if expectSeq != nil {
		opts = append(opts, jetstream.WithExpectLastSequencePerSubject(*expectSeq))
	}
	msg := &nats.Msg{Subject: ev.Subject, Data: body, Header: nats.Header{}}
	msg.Header.Set("Ce-Type", ev.Type())
	ack, err := a.JS.PublishMsg(ctx, msg, opts...)
	if err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
			return 0, false, fmt.Errorf("%w: %s on %s", ErrConflict, ev.ID, ev.Subject)
		}
		return 0, false, fmt.Errorf("append %s to %s: %w", ev.ID, ev.Subject, err)
	}
	return ack.Sequence, ack.Duplicate, nil
}

// New stamps a payload as a fact from this appender's source.
func (a *Appender) New(at time.Time, p events.Payload) events.Event {
	return events.New(a.Source, at, p)
}
