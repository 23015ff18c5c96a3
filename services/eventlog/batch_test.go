package eventlog_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
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
