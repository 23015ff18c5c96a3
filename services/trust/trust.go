// Package trust holds the keys a fleet trusts to seal placements: the
// dispatchers' curve public keys, published in the KV bucket berth_trust
// (events.BucketTrust) by the admin alone (NATS permissions), and read by
// every agent before it opens a sealed JIT config (law 10: an agent opens
// only placements a known dispatcher sealed).
package trust

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/nats-io/nats.go/jetstream"
)

// Set is the trusted dispatcher keys, kept current by Watch. Safe for
// concurrent use; the zero value trusts nothing.
type Set struct {
	mu   sync.RWMutex
	keys map[string]string // curve public key → whose (the entry's value)
	seen bool              // the bucket was read at least once
}

// Dispatcher reports whether pub is a trusted dispatcher's sealing key.
func (s *Set) Dispatcher(pub string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	_, ok := s.keys[pub]
	return ok
}

// Ready reports whether the bucket has been read: until then every key is
// unknown, and a refusal says so.
func (s *Set) Ready() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.seen
}

// Len is how many dispatcher keys are trusted.
func (s *Set) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.keys)
}

func (s *Set) put(key, value string, deleted bool) {
	pub, ok := strings.CutPrefix(key, "dispatcher.")
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys == nil {
		s.keys = map[string]string{}
	}
	if deleted {
		delete(s.keys, pub)
	} else {
		s.keys[pub] = value
	}
}

func (s *Set) markSeen() {
	s.mu.Lock()
	s.seen = true
	s.mu.Unlock()
}

// Watch keeps s current with the trust bucket until ctx ends: a key the
// admin adds is trusted within a moment, one it deletes is no longer
// trusted (rotation). A bucket that does not exist yet is waited for.
func Watch(ctx context.Context, js jetstream.JetStream, s *Set, logger *slog.Logger) {
	for ctx.Err() == nil {
		if err := watchOnce(ctx, js, s); err != nil && ctx.Err() == nil {
			logger.Warn("trust bucket not readable yet; sealed placements wait (the admin creates it: `berth stream apply`)",
				"bucket", events.BucketTrust, "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
	}
}

func watchOnce(ctx context.Context, js jetstream.JetStream, s *Set) error {
	kv, err := js.KeyValue(ctx, events.BucketTrust)
	if err != nil {
		return err
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("trust watch ended")
			}
			if e == nil { // the initial values are all delivered
				s.markSeen()
				continue
			}
			s.put(e.Key(), string(e.Value()), e.Operation() != jetstream.KeyValuePut)
		}
	}
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
