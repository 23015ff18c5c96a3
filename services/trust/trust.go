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
	"strings"
	"sync"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Set answers whether a dispatcher key is trusted, reading berth_trust
// key by key (a direct get: an agent may read that bucket, not list or
// watch it) and remembering a trusted key for CacheFor, so a key the admin
// deletes is refused again within that time. Safe for concurrent use.
//
// A NATS fault must not stop a host from opening what a trusted key
// sealed (law 11: the fault is NATS's, not the host's). So each read is a
// direct get, which any current replica answers, with no STREAM.INFO
// (which needs the stream's leader: read); and while the bucket does not
// answer, a key read trusted within StaleFor stays trusted. A key the
// bucket says is gone is refused at once.
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

// read asks the bucket whether pub is there: one direct get of the key's
// last value, sent as JetStream's wire request ($JS.API.DIRECT.GET.<the
// bucket's stream>.<the key's subject>, ADR-31) because nats.go's KV
// handle first asks STREAM.INFO, which only the stream's leader answers,
// and a cluster re-elects one for seconds after losing a node (a chaos
// run's restarted agent could not open placements for that long). Any
// current replica answers a direct get. A key deleted or purged (its last
// value marked KV-Operation DEL or PURGE) is not there.
func (s *Set) read(ctx context.Context, pub string) (bool, error) {
	subj := apiPrefix(s.JS) + "DIRECT.GET.KV_" + events.BucketTrust + ".$KV." + events.BucketTrust + "." +
		events.TrustKeyDispatcher(pub)
	msg, err := s.JS.Conn().RequestWithContext(ctx, subj, nil)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return false, fmt.Errorf("%w: no server answers for it (the admin creates it: `berth stream apply`)", ErrUnreadable)
	case err != nil:
		return false, fmt.Errorf("%w: %v", ErrUnreadable, err)
	}
	switch status := msg.Header.Get("Status"); status {
	case "":
	case "404":
		return false, nil
	default:
		return false, fmt.Errorf("%w: the server answered %s %s", ErrUnreadable, status, msg.Header.Get("Description"))
	}
	switch msg.Header.Get("KV-Operation") {
	case "DEL", "PURGE":
		return false, nil
	}
	return true, nil
}

// apiPrefix is the JetStream API prefix js sends its requests under
// (jetstream.DefaultAPIPrefix unless it was made with another).
func apiPrefix(js jetstream.JetStream) string {
	o := js.Options()
	switch {
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	case o.APIPrefix == "":
		return jetstream.DefaultAPIPrefix
	case !strings.HasSuffix(o.APIPrefix, "."):
		return o.APIPrefix + "."
	}
	return o.APIPrefix
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
