package eventlog

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// An agent may not call STREAM.INFO on the log (services/natsauth): NATS
// permissions cannot see a request's subjects_filter, so that right let an
// agent list every subject in the log, every host, pool and attempt
// (issue 16, F2). What an agent needs of the log it reads with direct gets
// of the last fact on its own subjects, which its permissions name.

// Stored is one message as the log stores it: sequence, subject, the
// server's timestamp and the bytes.
type Stored struct {
	Seq     uint64
	Subject string
	Time    time.Time
	Data    []byte
}

// LastOn reads the last fact stored on subject (wildcards allowed:
// JetStream's last_by_subj) with a direct get
// ($JS.API.DIRECT.GET.BERTH_EVENTS.<subject>, no stream info needed),
// bounded by 5 s. Nothing stored there: jetstream.ErrMsgNotFound; no
// stream: ErrStreamMissing (nobody answers direct gets of a stream that
// does not exist).
func LastOn(ctx context.Context, js jetstream.JetStream, subject string) (Stored, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := js.Conn().RequestWithContext(ctx, "$JS.API.DIRECT.GET."+events.StreamName+"."+subject, nil)
	if errors.Is(err, nats.ErrNoResponders) {
		return Stored{}, ErrStreamMissing
	}
	if err != nil {
		return Stored{}, fmt.Errorf("last fact on %s: %w", subject, err)
	}
	switch status := m.Header.Get("Status"); status {
	case "":
	case "404":
		return Stored{}, jetstream.ErrMsgNotFound
	default:
		return Stored{}, fmt.Errorf("%w: %s %s (last on %s)", ErrDirectGet, status, m.Header.Get("Description"), subject)
	}
	seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return Stored{}, fmt.Errorf("%w: an answer without %s", ErrDirectGet, jetstream.SequenceHeader)
	}
	at, _ := time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer))
	return Stored{Seq: seq, Subject: m.Header.Get(jetstream.SubjectHeader), Time: at, Data: m.Data}, nil
}

// StreamThere checks that the log exists with a direct get of the last
// fact on subject (one the caller may read): nil when it does (whether or
// not subject holds a fact), ErrStreamMissing when it does not, another
// error when the server did not say. It sees nothing of the stream's
// config: a credential without STREAM.INFO (an agent) cannot see drift.
func StreamThere(ctx context.Context, js jetstream.JetStream, subject string) error {
	_, err := LastOn(ctx, js, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	return err
}
