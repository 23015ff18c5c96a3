package eventlog_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/nats-io/nats.go/jetstream"
)

// Given a 3-node cluster and an R3 stream, when the stream's leader is
// killed while facts are being appended (each retried with the same id
// until stored, as every Berth writer does), then every fact is stored
// exactly once and appending continues within seconds (law 9: the
// Nats-Msg-Id makes a retried publish harmless across a leader change).
func TestKillingTheStreamLeaderLosesAndDoublesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster takes a few seconds")
	}
	servers, urls := testkit.Cluster(t, 3)
	nc, js, err := eventlog.Connect(urls, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ensureR3(ctx, t, js)
	app := &eventlog.Appender{JS: js, Source: "test", Timeout: 2 * time.Second}
	const total = 600
	var killedAt time.Time
	var resumed time.Duration
	for i := 1; i <= total; i++ {
		ev := app.New(time.Now(), events.JobQueued{JobRef: events.JobRef{Delivery: fmt.Sprintf("d-%d", i), JobID: int64(i), Labels: []string{"x"}}})
		for attempt := 0; ; attempt++ {
			_, _, err := app.Append(ctx, ev, nil)
			if err == nil {
				break
			}
			if ctx.Err() != nil || errors.Is(err, eventlog.ErrConflict) {
				t.Fatalf("fact %d not stored: %v", i, err)
			}
			time.Sleep(100 * time.Millisecond) // the writer's retry pause, as in production: part of what is measured
		}
		if !killedAt.IsZero() && resumed == 0 {
			resumed = time.Since(killedAt)
		}
		if i == total/3 {
			s, err := js.Stream(ctx, events.StreamName)
			if err != nil {
				t.Fatal(err)
			}
			info, err := s.Info(ctx)
			if err != nil || info.Cluster == nil {
				t.Fatalf("stream info: %v", err)
			}
			for _, srv := range servers {
				if srv.Name() == info.Cluster.Leader {
					srv.Shutdown()
					killedAt = time.Now()
				}
			}
			if killedAt.IsZero() {
				t.Fatalf("stream leader %q is none of the nodes", info.Cluster.Leader)
			}
		}
	}
	if resumed > 20*time.Second {
		t.Errorf("appending resumed %v after the leader died, want seconds", resumed)
	}
	f, err := eventlog.Replay(ctx, js, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Jobs) != total || f.LastSeq != total {
		t.Fatalf("%d jobs in %d stored facts, want exactly %d of each", len(f.Jobs), f.LastSeq, total)
	}
	t.Logf("leader killed after %d facts; appends resumed after %v", total/3, resumed.Round(time.Millisecond))
}

// ensureR3 creates the R3 stream, retrying while the cluster moves its
// meta leader.
func ensureR3(ctx context.Context, t *testing.T, js jetstream.JetStream) {
	t.Helper()
	testkit.EventuallyErr(t, 30*time.Second, "R3 stream created", func() error {
		actx, acancel := context.WithTimeout(ctx, 3*time.Second)
		defer acancel()
		_, err := eventlog.EnsureStream(actx, js, eventlog.StreamConfig{Replicas: 3})
		return err
	})
}

// Given a clustered stream holding one replica's booking of an attempt,
// when a lagging replica books the same attempt id for another host with
// a stale expected ledger sequence, then the server answers "duplicate"
// with the first booking's sequence instead of a conflict: a clustered
// stream checks the Nats-Msg-Id before the expected sequence (nats-server
// v2.15.2, checkMsgHeadersPreClusteredProposal), where a single server
// checks the sequence first. So a writer may not take a duplicate answer
// for its own contents: the dispatcher folds its own ledger fact only when
// the answer is not a duplicate (found by the chaos run: a replica that
// folded its own version placed the attempt on a host nobody tore down).
func TestAClusteredDuplicateBookingAnswersDuplicateNotConflict(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster takes a few seconds")
	}
	_, urls := testkit.Cluster(t, 3)
	nc, js, err := eventlog.Connect(urls, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ensureR3(ctx, t, js)
	app := &eventlog.Appender{JS: js, Source: "test", Timeout: 5 * time.Second}
	book := func(host string) events.Event {
		return app.New(time.Now(), events.SlotReserved{Pool: "linux", Host: host, Attempt: events.AttemptID(7, 3), JobID: 7, N: 3, Labels: []string{"x"}})
	}
	empty := uint64(0)
	first, dup, err := app.Append(ctx, book("host-b"), &empty)
	if err != nil || dup {
		t.Fatalf("first booking: seq %d dup %v err %v", first, dup, err)
	}
	seq, dup, err := app.Append(ctx, book("host-a"), &empty)
	if err != nil || !dup || seq != first {
		t.Fatalf("same id, other host, stale expected sequence: seq %d dup %v err %v; want the first's seq %d as a duplicate", seq, dup, err, first)
	}
	other := app.New(time.Now(), events.SlotReserved{Pool: "linux", Host: "host-a", Attempt: events.AttemptID(8, 1), JobID: 8, N: 1, Labels: []string{"x"}})
	if _, _, err := app.Append(ctx, other, &empty); !errors.Is(err, eventlog.ErrConflict) {
		t.Fatalf("new id, stale expected sequence: err %v, want ErrConflict", err)
	}
	f, err := eventlog.Replay(ctx, js, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a := f.Attempts[events.AttemptID(7, 3)]; a == nil || a.Host != "host-b" || f.LastSeq != first {
		t.Fatalf("log holds %+v up to seq %d; want only the first booking, on host-b", a, f.LastSeq)
	}
}
