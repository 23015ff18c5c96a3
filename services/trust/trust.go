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
type Set struct {
	JS jetstream.JetStream
	// CacheFor is how long a trusted answer is kept; 0 means 1 min.
	CacheFor time.Duration
	Now      func() time.Time

	mu   sync.Mutex
	seen map[string]time.Time // key → when it was read trusted
}

// ErrUnreadable: the bucket did not answer; nothing is known (law 7), so
// the caller waits and asks again rather than refusing.
var ErrUnreadable = errors.New("trust bucket unreadable")

// Dispatcher reports whether pub is a trusted dispatcher's sealing key. A
// key that is not in the bucket is untrusted (false, nil); a bucket that
// does not answer is an error wrapping ErrUnreadable.
func (s *Set) Dispatcher(ctx context.Context, pub string) (bool, error) {
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	cache := s.CacheFor
	if cache <= 0 {
		cache = time.Minute
	}
	s.mu.Lock()
	at, ok := s.seen[pub]
	s.mu.Unlock()
	if ok && now().Sub(at) < cache {
		return true, nil
	}
	kv, err := s.JS.KeyValue(ctx, events.BucketTrust)
	if err != nil {
		return false, fmt.Errorf("%w: %v (the admin creates it: `berth stream apply`)", ErrUnreadable, err)
	}
	_, err = kv.Get(ctx, events.TrustKeyDispatcher(pub))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		s.mu.Lock()
		delete(s.seen, pub)
		s.mu.Unlock()
		return false, nil
	case err != nil:
		return false, fmt.Errorf("%w: %v", ErrUnreadable, err)
	}
	s.mu.Lock()
	if s.seen == nil {
		s.seen = map[string]time.Time{}
	}
	s.seen[pub] = now()
	s.mu.Unlock()
	return true, nil
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
