package trust_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/natsembed"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/services/trust"
	"github.com/nats-io/nats.go"
)

// ask reads pub with a short deadline: a bucket that does not answer must
// come back as ErrUnreadable, not hang.
func ask(t *testing.T, s *trust.Set, pub string) (bool, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return s.Dispatcher(ctx, pub)
}

// Given a key the bucket said was trusted, when the bucket stops answering
// (its server is gone) after the cache has run out, then the key is still
// trusted for StaleFor, and unreadable after it; a key never read is
// unreadable at once. A NATS fault does not stop a host from opening what
// a dispatcher it trusts sealed (law 11), and an admin's deletion goes
// unseen for StaleFor at most.
func TestATrustedKeyOutlastsAnUnreadableBucketForStaleFor(t *testing.T) {
	t.Parallel()
	srv := testkit.Server(t, natsembed.EmbeddedConfig{})
	_, js := testkit.Connect(t, srv.ClientURL(), nats.MaxReconnects(-1))
	if err := trust.AddDispatcher(context.Background(), js, "KEY-A", "dispatcher a"); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	s := &trust.Set{JS: js, CacheFor: time.Minute, StaleFor: 10 * time.Minute, Now: func() time.Time { return now }}
	if ok, err := ask(t, s, "KEY-A"); !ok || err != nil {
		t.Fatalf("KEY-A with the bucket up: %v, %v; want trusted", ok, err)
	}

	srv.Shutdown()
	srv.WaitForShutdown()
	now = now.Add(5 * time.Minute) // past CacheFor: the bucket is asked, and does not answer
	if ok, err := ask(t, s, "KEY-A"); !ok || err != nil {
		t.Fatalf("KEY-A 5 min after it was read, the bucket down: %v, %v; want still trusted", ok, err)
	}
	if ok, err := ask(t, s, "KEY-B"); ok || !errors.Is(err, trust.ErrUnreadable) {
		t.Fatalf("KEY-B never read, the bucket down: %v, %v; want ErrUnreadable", ok, err)
	}
	now = now.Add(6 * time.Minute) // 11 min since the bucket last said so
	if ok, err := ask(t, s, "KEY-A"); ok || !errors.Is(err, trust.ErrUnreadable) {
		t.Fatalf("KEY-A 11 min after it was read, the bucket down: %v, %v; want ErrUnreadable", ok, err)
	}
}

// Given a set, when it reads a key three times past its cache, then it
// makes no STREAM.INFO request (that request needs the stream's leader,
// which a cluster re-elects for seconds after losing a node; a direct get
// does not); and a key the admin deleted is refused at the next read
// past the cache, however recently it was trusted.
func TestTheBucketIsReadWithoutStreamInfoAndADeletedKeyIsRefusedAtOnce(t *testing.T) {
	t.Parallel()
	url, js, _ := testkit.NATS(t)
	if err := trust.AddDispatcher(context.Background(), js, "KEY-A", "dispatcher a"); err != nil {
		t.Fatal(err)
	}
	watch, _ := testkit.Connect(t, url)
	var infos atomic.Int64
	sub, err := watch.Subscribe("$JS.API.STREAM.INFO.KV_"+events.BucketTrust, func(*nats.Msg) { infos.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	now := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	s := &trust.Set{JS: js, CacheFor: time.Minute, Now: func() time.Time { return now }}
	for i := range 3 {
		now = now.Add(2 * time.Minute) // past the cache: each read asks the bucket
		if ok, err := ask(t, s, "KEY-A"); !ok || err != nil {
			t.Fatalf("read %d: %v, %v; want trusted", i, ok, err)
		}
	}
	if err := watch.Flush(); err != nil { // the requests seen so far have been delivered
		t.Fatal(err)
	}
	if n := infos.Load(); n != 0 {
		t.Fatalf("three reads made %d STREAM.INFO requests, want none", n)
	}

	kv, err := js.KeyValue(context.Background(), events.BucketTrust)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(context.Background(), events.TrustKeyDispatcher("KEY-A")); err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * time.Minute)
	if ok, err := ask(t, s, "KEY-A"); ok || err != nil {
		t.Fatalf("KEY-A after the admin deleted it: %v, %v; want refused", ok, err)
	}
}
