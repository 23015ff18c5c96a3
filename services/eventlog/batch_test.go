package eventlog_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// teardowns is a plan of n teardown requests (facts on no ledger), one of
// them twice.
func teardowns(n int) events.Plan {
	var plan events.Plan
	for i := 1; i <= n; i++ {
		plan.Add(events.Fact(events.AttemptTeardownRequested{AttemptRef: events.AttemptRef{Attempt: fmt.Sprintf("berth-%d-1", i), Pool: "linux", Host: "h"}, Reason: "test"}))
	}
	plan.Add(plan[0])
	return plan
}

// Given a round's facts that are checked against no ledger, when the plan
// is executed, then they are stored once each, in the plan's order, each
// told to Stored; executed again (the facts not folded yet) nothing is
// stored twice; and once folded and forgotten, executing the plan again
// stores nothing new either (the server's duplicate answers stand).
func TestARoundsFactsAreAppendedTogetherInOrderAndOnce(t *testing.T) {
	s, js, _ := shellOn(t)
	ctx := context.Background()
	var told []string
	s.Stored = func(st events.Step) { told = append(told, st.Fact.EventID()) }
	plan := teardowns(20)
	s.Execute(ctx, plan, nil)
	if got := stored(t, js); got != 20 {
		t.Fatalf("stored %d facts, want 20", got)
	}
	if len(told) != 20 {
		t.Fatalf("Stored told of %d steps, want 20", len(told))
	}
	str, err := js.Stream(ctx, events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 20; seq++ {
		m, err := str.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := events.Unmarshal(m.Data, seq)
		if err != nil {
			t.Fatal(err)
		}
		if want := plan[seq-1].Fact.EventID(); ev.ID != want {
			t.Fatalf("seq %d holds %s, want %s: the log is not in the plan's order", seq, ev.ID, want)
		}
		s.Apply(eventlog.Delivered{Event: ev})
	}
	s.Execute(ctx, plan, nil)
	if got := stored(t, js); got != 20 || len(told) != 20 {
		t.Fatalf("executed again: %d facts stored, %d told; want 20 and 20", got, len(told))
	}
}

// BenchmarkExecuteRound appends a round of 50 facts on no ledger: one
// after the other, each awaited (a crash point around the type forces
// that path), against published together and awaited together.
func BenchmarkExecuteRound(b *testing.B) {
	for _, mode := range []string{"one-by-one", "together"} {
		b.Run(mode, func(b *testing.B) {
			s, _, _ := shellOn(b)
			if mode == "one-by-one" {
				s.Crash = map[string][2]string{events.TypeAttemptTeardownRequested: {"", "unset-crash-point"}}
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				var plan events.Plan
				for k := 0; k < 50; k++ {
					plan.Add(events.Fact(events.AttemptTeardownRequested{AttemptRef: events.AttemptRef{Attempt: fmt.Sprintf("berth-%d-%d", i, k), Pool: "linux", Host: "h"}, Reason: "test"}))
				}
				s.Execute(ctx, plan, nil)
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*50), "µs/fact")
		})
	}
}

// BenchmarkLedgerChain appends a round's chain of three bookings on one
// pool's ledger as the shell does (each with the ledger's expected last
// sequence, each awaited before the next), against the same three as one
// JetStream atomic batch (ADR-50, nats-server 2.12: Nats-Batch-Id,
// -Sequence and -Commit, the expected sequence on the first message only),
// which issue 19 proposed for the chain. On a one-replica file-storage
// stream (berth dev, the bench) the server stages every atomic batch in a
// file store of its own, created and removed per batch, so the batch costs
// milliseconds where the chain costs a few hundred microseconds: the chain
// stays one append at a time.
func BenchmarkLedgerChain(b *testing.B) {
	const chain = 3
	booking := func(round, i int) events.SlotReserved {
		return events.SlotReserved{Pool: "linux", Host: "h", Attempt: fmt.Sprintf("berth-%d%03d-1", round+1, i), JobID: int64(round*chain + i + 1), N: 1}
	}
	b.Run("one-by-one", func(b *testing.B) {
		s, js, _ := shellOn(b)
		ctx := context.Background()
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			var plan events.Plan
			for k := 0; k < chain; k++ {
				plan.Add(events.Fact(booking(i, k)))
			}
			s.Execute(ctx, plan, nil)
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/chain")
		if last, err := eventlog.LastSeq(ctx, js); err != nil || last != uint64(b.N*chain) {
			b.Fatalf("stored %d bookings (%v), want %d: a chain conflicted", last, err, b.N*chain)
		}
	})
	b.Run("atomic-batch", func(b *testing.B) {
		_, js, _ := testkit.NATS(b)
		testkit.Stream(b, js, eventlog.StreamConfig{})
		ctx := context.Background()
		str, err := js.Stream(ctx, events.StreamName)
		if err != nil {
			b.Fatal(err)
		}
		cfg := str.CachedInfo().Config
		cfg.AllowAtomicPublish = true
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			b.Fatal(err)
		}
		nc, a := js.Conn(), &eventlog.Appender{JS: js, Source: "test", Role: events.RoleDispatcher}
		var last uint64
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			for k := 0; k < chain; k++ {
				ev := a.New(time.Now(), booking(i, k))
				body, err := events.Marshal(ev)
				if err != nil {
					b.Fatal(err)
				}
				m := &nats.Msg{Subject: ev.Subject, Data: body, Header: nats.Header{}}
				m.Header.Set(jetstream.MsgIDHeader, eventlog.MsgID(ev))
				m.Header.Set("Nats-Batch-Id", fmt.Sprintf("chain-%d", i))
				m.Header.Set("Nats-Batch-Sequence", strconv.Itoa(k+1))
				if k == 0 {
					m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(last, 10))
					m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, events.AggregateFilter(ev.Subject))
				}
				if k < chain-1 {
					if err := nc.PublishMsg(m); err != nil {
						b.Fatal(err)
					}
					continue
				}
				m.Header.Set("Nats-Batch-Commit", "1")
				resp, err := nc.RequestMsg(m, 5*time.Second)
				if err != nil {
					b.Fatal(err)
				}
				var ack struct {
					Seq   uint64 `json:"seq"`
					Error *struct {
						Description string `json:"description"`
					} `json:"error"`
				}
				if err := json.Unmarshal(resp.Data, &ack); err != nil || ack.Error != nil {
					b.Fatalf("batch %d: %s (%v)", i, resp.Data, err)
				}
				last = ack.Seq
			}
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/chain")
		if last != uint64(b.N*chain) {
			b.Fatalf("stored up to seq %d, want %d", last, b.N*chain)
		}
	})
}
