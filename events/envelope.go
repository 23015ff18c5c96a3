package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	fastjson "github.com/segmentio/encoding/json"
)

// SpecVersion is the CloudEvents version of every envelope Berth writes.
const SpecVersion = "1.0"

// Envelope is a CloudEvents 1.0 event in structured JSON mode
// (https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/formats/json-format.md).
//
// ID is deterministic per fact (a GitHub delivery id, or an attempt id plus a
// transition) and doubles as the JetStream Nats-Msg-Id, so a retried publish is
// deduplicated by the server. Subject is the NATS subject the event is stored
// under (see subjects.go).
type Envelope struct {
	EnvelopeHead
	Data json.RawMessage `json:"data"`
}

// EnvelopeHead is an envelope's fields but its payload (Data, the last):
// Marshal encodes it and splices the payload in.
type EnvelopeHead struct {
	SpecVersion     string    `json:"specversion"`
	ID              string    `json:"id"`
	Source          string    `json:"source"`
	Type            string    `json:"type"`
	Time            time.Time `json:"time"`
	Subject         string    `json:"subject"`
	DataContentType string    `json:"datacontenttype,omitempty"`
}

// Event is one decoded fact: its envelope fields, its payload, and the stream
// sequence it was stored at (0 when it has not been stored yet).
type Event struct {
	ID      string
	Source  string
	Time    time.Time
	Subject string
	Seq     uint64
	Data    Payload
}

// Type is the versioned CloudEvents type of the event's payload, or "" for
// an event whose type this build does not know (Data is nil).
func (e Event) Type() string {
	if e.Data == nil {
		return ""
	}
	return e.Data.EventType()
}

// Payload is implemented by every type in the catalogue.
type Payload interface {
	// EventType is the versioned CloudEvents type, e.g. "berth.job.queued.v1".
	EventType() string
	// EventSubject is the NATS subject the fact is stored under.
	EventSubject() string
	// EventID is the deterministic idempotency key (also the Nats-Msg-Id).
	EventID() string
}

// ErrUnknownType marks an envelope whose type (or version) this build does not
// know. Consumers skip and count such events; they are never fatal.
var ErrUnknownType = errors.New("unknown event type")

// ErrMalformed marks bytes that are not a valid Berth envelope.
var ErrMalformed = errors.New("malformed event")

// New wraps a payload in an event stamped with source and time, written
// as its type's first author (NewBy with no role).
func New(source string, at time.Time, p Payload) Event { return NewBy(source, "", at, p) }

// NewBy wraps a payload written by role: stored on SubjectBy(p, role). An
// empty role writes it as its type's first author (Authors): for tests and
// tools that lay down a history; every service names its own role, and
// the server's permissions hold each credential to it.
func NewBy(source string, role Role, at time.Time, p Payload) Event {
	if role == "" {
		if as := authors[p.EventType()]; len(as) > 0 {
			role = as[0]
		}
	}
	return Event{ID: p.EventID(), Source: source, Time: at.UTC(), Subject: SubjectBy(p, role), Data: p}
}

// Marshal encodes the event as a structured-mode CloudEvents JSON envelope.
func Marshal(e Event) ([]byte, error) {
	if e.Data == nil {
		return nil, fmt.Errorf("%w: event %s has no payload", ErrUnknownType, e.ID)
	}
	data, err := json.Marshal(e.Data)
	if err != nil {
		return nil, fmt.Errorf("encode %s data: %w", e.Data.EventType(), err)
	}
	// The envelope's other fields, then the payload spliced in as the
	// last field: the bytes Envelope encodes to, without encoding/json
	// scanning the payload a second time to compact it (a raw message
	// is compacted again when it is encoded; json.Marshal's output is
	// already compact). That scan was a third of what encoding a fact
	// cost, and every writer encodes each fact it appends.
	head, err := json.Marshal(EnvelopeHead{
		SpecVersion:     SpecVersion,
		ID:              e.ID,
		Source:          e.Source,
		Type:            e.Data.EventType(),
		Time:            e.Time,
		Subject:         e.Subject,
		DataContentType: "application/json",
	})
	if err != nil {
		return nil, fmt.Errorf("encode %s envelope: %w", e.Data.EventType(), err)
	}
	b := make([]byte, 0, len(head)+len(`,"data":`)+len(data))
	b = append(b, head[:len(head)-1]...) // without its closing brace
	b = append(b, `,"data":`...)
	b = append(b, data...)
	return append(b, '}'), nil
}

// Unmarshal decodes an envelope and its payload. It returns an error wrapping
// ErrMalformed for bytes that are not an envelope, and ErrUnknownType for a
// type this build does not know (the envelope fields are still filled in).
func Unmarshal(b []byte, seq uint64) (ev Event, err error) {
	defer func() {
		// The decoder works with unsafe code; should it ever panic on some
		// input, that input is malformed, not a reason to stop a follower.
		if p := recover(); p != nil {
			ev, err = Event{}, fmt.Errorf("%w: decoder panic: %v", ErrMalformed, p)
		}
	}()
	// Decoded by segmentio/encoding's json, a drop-in for encoding/json
	// that copies every string out of b (a fold keeps them for days) and is
	// about 3× faster (BenchmarkUnmarshalLifecycle); replay and every
	// follower are mostly this. FuzzUnmarshal holds it to encoding/json's
	// answers; the one known difference: it also reads a duration written
	// as a Go duration string ("40ms"), which no Berth writer produces.
	var env Envelope
	if err := fastjson.Unmarshal(b, &env); err != nil {
		return Event{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if env.SpecVersion != SpecVersion || env.ID == "" || env.Type == "" {
		return Event{}, fmt.Errorf("%w: specversion %q, id %q, type %q", ErrMalformed, env.SpecVersion, env.ID, env.Type)
	}
	ev = Event{ID: env.ID, Source: env.Source, Time: env.Time, Subject: env.Subject, Seq: seq}
	newPayload, ok := catalogue[env.Type]
	if !ok {
		return ev, fmt.Errorf("%w: %s", ErrUnknownType, env.Type)
	}
	p := newPayload()
	if err := fastjson.Unmarshal(env.Data, p); err != nil {
		return ev, fmt.Errorf("%w: %s data: %v", ErrMalformed, env.Type, err)
	}
	ev.Data = p
	return ev, nil
}

// ClampToStored caps the fact's time at stored, the server's timestamp of
// the message that holds it (law 10: time is never another machine's
// word). A writer whose clock runs ahead, or who lies, stamps a fact in
// the future; every deadline and window that counts from the fact's time
// (a booking's provisioning deadline, a host's back-off) would then run
// from a moment that has not come. Clamped, it counts from when the log
// stored it. It caps from above only: a fact stamped in the past keeps its
// time. A zero stored time (unknown) changes nothing.
func (e *Event) ClampToStored(stored time.Time) {
	if !stored.IsZero() && e.Time.After(stored) {
		e.Time = stored.UTC()
	}
}
