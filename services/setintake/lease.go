package setintake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/berth-ci/berth/services/clock"
)

// Record is a scale set's entry in berth_scalesets (key: the set's name):
// who holds its session, which session, and the last message whose facts
// are stored. Every write is checked against the revision read last, so
// two replicas never both believe they hold it.
type Record struct {
	Owner         string `json:"owner"`
	ScaleSetID    int    `json:"scale_set_id"`
	SessionID     string `json:"session_id,omitempty"`
	LastMessageID int    `json:"last_message_id"`
	// RenewedAt is the holder's clock at its last renewal, for operators
	// only: no replica compares another's clock with its own.
	RenewedAt time.Time `json:"renewed_at"`
}

// ErrLeaseLost: the record moved under us (another replica took the set).
var ErrLeaseLost = errors.New("scale set lease lost to another replica")

// lease is one replica's view of one set's record.
type lease struct {
	kv    jetstream.KeyValue
	key   string
	owner string
	ttl   time.Duration
	clk   clock.Clock

	mu     sync.Mutex
	rev    uint64 // revision of our last write while held
	rec    Record
	seen   uint64    // revision last seen held by another
	seenAt time.Time // our clock when we first saw it
}

// tryAcquire takes the lease when the record is missing, already ours (a
// restart under the same owner name), or has not moved for ttl on our own
// clock. It keeps the record's session id and cursor.
func (l *lease) tryAcquire(ctx context.Context) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, err := l.kv.Get(ctx, l.key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		rec := Record{Owner: l.owner, RenewedAt: l.clk.Now()}
		rev, err := l.kv.Create(ctx, l.key, mustJSON(rec))
		if err != nil {
			return false, nil // another replica created it first
		}
		l.rev, l.rec = rev, rec
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("read lease %s: %w", l.key, err)
	}
	var rec Record
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return false, fmt.Errorf("lease %s unreadable (%v): delete the key with `nats kv del berth_scalesets %s`", l.key, err, l.key)
	}
	if rec.Owner != l.owner {
		now := l.clk.Now()
		if e.Revision() != l.seen {
			l.seen, l.seenAt = e.Revision(), now
			return false, nil
		}
		if now.Sub(l.seenAt) < l.ttl {
			return false, nil
		}
	}
	rec.Owner, rec.RenewedAt = l.owner, l.clk.Now()
	rev, err := l.kv.Update(ctx, l.key, mustJSON(rec), e.Revision())
	if err != nil {
		return false, nil // it moved: someone renewed or took it
	}
	l.rev, l.rec = rev, rec
	return true, nil
}

// write stores the record changed by mutate, checked against our last
// revision: ErrLeaseLost when another replica wrote since.
func (l *lease) write(ctx context.Context, mutate func(*Record)) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	rec := l.rec
	mutate(&rec)
	rec.RenewedAt = l.clk.Now()
	rev, err := l.kv.Update(ctx, l.key, mustJSON(rec), l.rev)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return ErrLeaseLost
		}
		return fmt.Errorf("write lease %s: %w", l.key, err)
	}
	l.rev, l.rec = rev, rec
	return nil
}

func (l *lease) renew(ctx context.Context) error { return l.write(ctx, func(*Record) {}) }

func (l *lease) record() Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rec
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
