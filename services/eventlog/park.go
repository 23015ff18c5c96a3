package eventlog

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/berth-ci/berth/events"
)

// Parked is what a reader records about a fact it parked: the value of
// events.ParkedKey(reader, stream seq) in events.BucketParked, one key per
// parked delivery. The fact itself stays in the log; the record says who
// could not react to it and why. Read them with `nats kv ls berth_parked`
// and `nats kv get berth_parked KEY`; once the cause is fixed, a restart of
// the reader folds the fact again (the record can then be deleted).
type Parked struct {
	Reader     string    `json:"reader"`
	Seq        uint64    `json:"seq"`
	Subject    string    `json:"subject"`
	ID         string    `json:"id,omitempty"`
	Type       string    `json:"type,omitempty"`
	Deliveries uint64    `json:"deliveries"`
	Error      string    `json:"error"`
	At         time.Time `json:"at"`
}

// reader names the loop in parking records and logs.
func (l *Loop) reader() string {
	switch {
	case l.Consumer != nil && l.Consumer.Name != "":
		return l.Consumer.Name
	case l.SnapshotKey != "":
		return l.SnapshotKey
	}
	return "reader"
}

// park records a poison fact off the loop (law 3); a record that cannot be
// stored is still logged and counted.
func (l *Loop) park(d Delivered, cause error) {
	p := Parked{Reader: l.reader(), Seq: d.Event.Seq, Subject: d.Event.Subject, ID: d.Event.ID,
		Type: d.Event.Type(), Deliveries: d.Deliveries, Error: cause.Error(), At: time.Now().UTC()}
	slog.Error("poison event parked: the fold skips it; see `nats kv get "+events.BucketParked+" "+l.parkKey(p)+"`, fix the cause, restart to fold it again",
		"reader", p.Reader, "seq", p.Seq, "subject", p.Subject, "type", p.Type, "err", cause)
	l.storeParkAsync(p)
}

// Refuse records a fact the shell refused (events.ErrForged: its subject
// does not confirm its payload or its author) like a poison fact: parked
// with the reason, never folded, never delivered again.
func (l *Loop) Refuse(d Delivered, cause error) {
	l.refused.Add(1)
	p := Parked{Reader: l.reader(), Seq: d.Event.Seq, Subject: d.Event.Subject, ID: d.Event.ID,
		Type: d.Event.Type(), Deliveries: d.Deliveries, Error: cause.Error(), At: time.Now().UTC()}
	slog.Error("fact refused and parked: the fold skips it; someone with write access to "+p.Subject+
		" wrote what only another role may say; see `nats kv get "+events.BucketParked+" "+l.parkKey(p)+"` and docs/security.md",
		"reader", p.Reader, "seq", p.Seq, "subject", p.Subject, "type", p.Type, "err", cause)
	if l.JS != nil {
		l.storeParkAsync(p)
	}
}

// Overclaim records a host announcement that claims more than the host's
// grant (events.Offer): the fold offers the host only what both say; the
// announcement is counted and parked with how it over-claims, so the admin
// sees it (a host_overclaim alarm names the command to run). The record is
// stored off the loop, like every parking record.
func (l *Loop) Overclaim(d Delivered, cause error) {
	l.overclaims.Add(1)
	p := Parked{Reader: l.reader(), Seq: d.Event.Seq, Subject: d.Event.Subject, ID: d.Event.ID,
		Type: d.Event.Type(), Deliveries: d.Deliveries, Error: cause.Error(), At: time.Now().UTC()}
	slog.Warn("host announcement claims more than its grant: offered only what the grant allows; grant it if the claim is right",
		"reader", p.Reader, "seq", p.Seq, "subject", p.Subject, "err", cause)
	if l.JS != nil {
		l.storeParkAsync(p)
	}
}

// maxParking bounds the parking records being stored at once: refused
// facts are an attacker's to multiply, and each store is a goroutine.
const maxParking = 32

// storeParkAsync stores a parking record off the loop (law 3), at most
// maxParking at a time; past that the record is only logged and counted
// (the fact stays in the log, where `berth events` shows it).
func (l *Loop) storeParkAsync(p Parked) {
	if l.parking.Add(1) > maxParking {
		l.parking.Add(-1)
		slog.Warn("parking record not stored: too many being stored at once", "seq", p.Seq, "subject", p.Subject)
		return
	}
	go func() {
		defer l.parking.Add(-1)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := l.storePark(ctx, p); err != nil {
			slog.Warn("parking record not stored", "seq", p.Seq, "err", err)
		}
	}()
}

// parkKey is where a parking record is stored: under the reader's
// snapshot key when it has one (the role's own prefix, which the NATS
// permissions confine it to), else under its consumer name.
func (l *Loop) parkKey(p Parked) string {
	if l.SnapshotKey != "" {
		return events.ParkedKey(l.SnapshotKey, p.Seq)
	}
	return events.ParkedKey(p.Reader, p.Seq)
}

func (l *Loop) storePark(ctx context.Context, p Parked) error {
	kv, err := OpenBucket(ctx, l.JS, events.BucketParked, l.Replicas)
	if err != nil {
		return err
	}
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	_, err = kv.Put(ctx, l.parkKey(p), b)
	return err
}
