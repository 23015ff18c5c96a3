package events_test

import (
	"strings"
	"testing"

	"github.com/berth-ci/berth/events"
)

// Every fact stored on a pool's slot ledger says so (Ledgered), and no
// other does: the act shell appends exactly these with the ledger's
// expected sequence, so a ledger fact that forgot would book around the
// optimistic concurrency check (law 1).
func TestLedgerFactsAreExactlyThoseOnAPoolSubject(t *testing.T) {
	for typ, zero := range events.Types() {
		onLedger := strings.HasPrefix(zero.EventSubject(), events.PoolSubject(""))
		_, ledgered := events.LedgerOf(zero)
		if onLedger != ledgered {
			t.Errorf("%s: stored on %q but Ledgered=%v", typ, zero.EventSubject(), ledgered)
		}
	}
}

type call string

func (c call) CallKey() string { return string(c) }

// A plan reads in order, Then steps included, filtered by type.
func TestPlanFactsAndCallsReadInOrderWithThenSteps(t *testing.T) {
	r1 := events.SlotReserved{Pool: "p", Attempt: "a1"}
	r2 := events.SlotReserved{Pool: "p", Attempt: "a2"}
	var plan events.Plan
	plan.Add(events.Step{Fact: r1, Then: []events.Step{events.Do(call("mint a1"))}},
		events.Fact(events.SlotReleased{Pool: "p", Attempt: "a0"}),
		events.Step{Fact: r2, Then: []events.Step{events.Do(call("mint a2"))}})
	got := events.Facts[events.SlotReserved](plan)
	if len(got) != 2 || got[0].Attempt != "a1" || got[1].Attempt != "a2" {
		t.Fatalf("reservations %v", got)
	}
	calls := events.Calls[call](plan)
	if len(calls) != 2 || calls[0] != "mint a1" || calls[1] != "mint a2" {
		t.Fatalf("calls %v", calls)
	}
	if n := len(events.Facts[events.SlotReleased](plan)); n != 1 {
		t.Fatalf("%d releases", n)
	}
}
