// Package trust holds the keys a fleet trusts to seal placements: the
// dispatchers' curve public keys, published in the KV bucket berth_trust
// (events.BucketTrust) by the admin alone (NATS permissions), and read by
// every agent before it opens a sealed JIT config (law 10: an agent opens
// only placements a known dispatcher sealed).
package trust

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/nats-io/nats.go/jetstream"
)

// Set answers whether a dispatcher key is trusted, reading berth_trust
// key by key (a direct get: an agent may read that bucket, not list or
// watch it) and remembering a trusted key for CacheFor, so a key the admin
// deletes is refused again within that time. Safe for concurrent use.
//
// A NATS fault must not stop a host from opening what a key it already
// trusts sealed (law 11: the fault is NATS's, not the host's). So the
// bucket is bound once (its STREAM.INFO needs the stream's leader, which
// a cluster re-elects for seconds after losing a node) and each read is
// then a direct get, which any current replica answers; and while the
// bucket does not answer, a key read trusted within StaleFor stays
// trusted. A key the bucket says is gone is refused at once.
type Set struct {
	JS jetstream.JetStream
	// CacheFor is how long a trusted answer is kept; 0 means 1 min.
	CacheFor time.Duration
	// StaleFor is how long a trusted answer still stands while the bucket
	// does not answer; 0 means 10 min. It bounds how long an admin's
	// deletion can go unseen by a host that cannot read the bucket.
	StaleFor time.Duration
	Now      func() time.Time

	mu   sync.Mutex
	kv   jetstream.KeyValue   // bound at the first read that finds the bucket
	seen map[string]time.Time // key → when it was last read trusted
}

// ErrUnreadable: the bucket did not answer; nothing is known (law 7), so
// the caller waits and asks again rather than refusing.
var ErrUnreadable = errors.New("trust bucket unreadable")

// Dispatcher reports whether pub is a trusted dispatcher's sealing key. A
// key that is not in the bucket is untrusted (false, nil); a bucket that
// does not answer is an error wrapping ErrUnreadable, unless pub was read
// trusted within StaleFor (true, nil).
func (s *Set) Dispatcher(ctx context.Context, pub string) (bool, error) {
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	s.mu.Lock()
	at, ok := s.seen[pub]
	s.mu.Unlock()
	if ok && now().Sub(at) < or(s.CacheFor, time.Minute) {
		return true, nil
	}
	trusted, err := s.read(ctx, pub)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case err != nil && ok && now().Sub(at) < or(s.StaleFor, 10*time.Minute):
		return true, nil // the bucket said so lately and says nothing now
	case err != nil:
		return false, err
	case !trusted:
		delete(s.seen, pub)
		return false, nil
	}
	if s.seen == nil {
		s.seen = map[string]time.Time{}
	}
	s.seen[pub] = now()
	return true, nil
}

// read asks the bucket whether pub is there, binding the bucket first if
// no read has yet.
func (s *Set) read(ctx context.Context, pub string) (bool, error) {
	s.mu.Lock()
	kv := s.kv
	s.mu.Unlock()
	if kv == nil {
		var err error
		if kv, err = s.JS.KeyValue(ctx, events.BucketTrust); err != nil {
			return false, fmt.Errorf("%w: %v (the admin creates it: `berth stream apply`)", ErrUnreadable, err)
		}
		s.mu.Lock()
		s.kv = kv
		s.mu.Unlock()
	}
	_, err := kv.Get(ctx, events.TrustKeyDispatcher(pub))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("%w: %v", ErrUnreadable, err)
	}
	return true, nil
}

func or(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// AddDispatcher trusts pub, naming whose it is. Only the admin's
// credentials may write the bucket; `berth dev` (one process, no
// authorization) does it for its own dispatcher.
func AddDispatcher(ctx context.Context, js jetstream.JetStream, pub, whose string) error {
	kv, err := js.KeyValue(ctx, events.BucketTrust)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = Bucket(ctx, js, 1) // no admin has made it: a single-process dev system
	}
	if err != nil {
		return err
	}
	_, err = kv.Put(ctx, events.TrustKeyDispatcher(pub), []byte(whose))
	return err
}

// Bucket creates (or opens) the trust bucket: an admin step.
func Bucket(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	return js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: events.BucketTrust,
		Description: "keys the fleet trusts: dispatchers' sealing keys (admin writes, agents read)", History: 1,
		Replicas: max(replicas, 1)})
}
