package procs_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/services/trust"
	"github.com/berth-ci/berth/tests/procs"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Given a 3-node cluster holding the trust bucket on every node, and an
// agent's trust set that has read a key once through the third node, when
// the other two nodes die (the bucket has no leader and cannot elect one),
// then the set still reads the key from the bucket, past its cache and
// with no stale answer allowed: a direct get, which the surviving replica
// answers within seconds. Before, each read asked STREAM.INFO first, which
// without a leader is answered some 10 s later or not at all, and a chaos
// run's agent could not open placements for longer than their 20 s
// provisioning deadline, which the watchdog charged to the host.
func TestTrustIsReadThroughTheLossOfTheBucketsLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node nats-server cluster")
	}
	t.Parallel()
	cluster := procs.StartCluster(t, 3)
	_, admin := testkit.Connect(t, cluster.URLs[2])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := trust.Bucket(ctx, admin, 3); err != nil {
		t.Fatal(err)
	}
	if err := trust.AddDispatcher(ctx, admin, "KEY-A", "dispatcher a"); err != nil {
		t.Fatal(err)
	}
	awaitReplicasCurrent(ctx, t, admin)

	_, js := testkit.Connect(t, cluster.URLs[2], nats.MaxReconnects(-1))
	now := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	s := &trust.Set{JS: js, CacheFor: time.Minute, StaleFor: time.Nanosecond, Now: func() time.Time { return now }}
	if ok, err := s.Dispatcher(ctx, "KEY-A"); !ok || err != nil {
		t.Fatalf("KEY-A with the cluster whole: %v, %v; want trusted", ok, err)
	}

	cluster.Nodes[0].Kill(t)
	cluster.Nodes[1].Kill(t)
	// A follower joins the bucket's direct gets on a 2 s tick once it has
	// caught up, so the survivor may take up to that long to answer. A
	// STREAM.INFO is answered only once the survivor judges the bucket
	// leaderless, some 10 s after its leader went (nats-server 2.15's
	// isGroupLeaderless): 4 s tells the two apart.
	deadline := time.Now().Add(4 * time.Second)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		now = now.Add(2 * time.Minute) // past the cache: the bucket is read again
		rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
		ok, err := s.Dispatcher(rctx, "KEY-A")
		rcancel()
		if ok && err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("KEY-A with one node of three left: %v, %v; want trusted, read from the surviving replica", ok, err)
		}
		<-tick.C
	}
}

// awaitReplicasCurrent waits (up to ctx's deadline) until both followers
// of the trust bucket hold its last message, so that the one left
// standing can answer.
func awaitReplicasCurrent(ctx context.Context, t *testing.T, js jetstream.JetStream) {
	t.Helper()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		var state string
		if st, err := js.Stream(ctx, "KV_"+events.BucketTrust); err != nil {
			state = err.Error()
		} else if c := st.CachedInfo().Cluster; c == nil || c.Leader == "" || len(c.Replicas) != 2 {
			state = fmt.Sprintf("cluster %+v", c)
		} else {
			for _, r := range c.Replicas {
				if !r.Current || r.Lag != 0 {
					state += fmt.Sprintf("%s current %v lag %d; ", r.Name, r.Current, r.Lag)
				}
			}
		}
		if state == "" {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the trust bucket's replicas did not catch up: %s", state)
		case <-tick.C:
		}
	}
}
