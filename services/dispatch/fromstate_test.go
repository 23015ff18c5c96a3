package dispatch_test

import (
	"testing"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/dispatch"
)

// Given an idle runner past its registration deadline whose deregistration
// GitHub confirmed (the fact is in the log) but whose release append was
// lost, when the dispatcher decides, then it releases the slot from that
// state alone: a release is derived each round, never a one-off side path
// of an API answer (issue 15; law 11).
func TestAConfirmedDeregistrationReleasesFromStateEachRound(t *testing.T) {
	l := given(t).add(host("h-a", 4, 4), queued(1))
	l.apply(l.decide())
	r := aref(1, 1, "h-a")
	l.add(&events.AttemptPlaced{AttemptRef: r, JobID: 1, RunnerID: 77},
		&events.AttemptProvisioning{AttemptRef: r}, &events.AttemptRunnerStarted{AttemptRef: r},
		completed(1, "", "cancelled"))
	plan := l.decide()
	if len(plan.Deregister) != 1 {
		t.Fatalf("deregister %v, want the surplus runner", plan.Deregister)
	}
	l.add(&events.AttemptDeregistered{AttemptRef: r, RunnerID: 77})
	for round := 1; round <= 2; round++ { // the first release "lost": decided again
		got := attempts(l.decide().Release)
		if got[r.Attempt] != events.ReleaseSurplus {
			t.Fatalf("round %d: releases %v, want %s released as surplus", round, got, r.Attempt)
		}
	}
}

// Given a booking whose JIT config GitHub refused, when the dispatcher
// decides with that answer in Params.Refused, then the slot is released
// with the reason the answer called for; and given a job whose failed
// attempts reach MaxAttempts with that very release, then no new slot is
// booked in the same round: the job is unschedulable (the release's
// failure counts before anything is booked).
func TestARefusedMintReleasesAndCountsBeforeBookingAgain(t *testing.T) {
	l := given(t).add(host("h-a", 4, 4), queued(1))
	l.apply(l.decide())
	p := params
	p.MaxAttempts = 1
	p.Refused = map[string]string{attempt(1, 1): events.ReleaseMintFailed}
	plan := dispatch.Decide(l.f, p)
	if got := attempts(plan.Release); got[attempt(1, 1)] != events.ReleaseMintFailed {
		t.Fatalf("releases %v, want %s released as mint_failed", got, attempt(1, 1))
	}
	if len(plan.Reserve) != 0 {
		t.Fatalf("booked %v in the round that spent the job's last attempt", plan.Reserve)
	}
	if len(plan.Unschedulable) != 1 || plan.Unschedulable[0].Attempts != 1 {
		t.Fatalf("unschedulable %v, want the job after 1 attempt", plan.Unschedulable)
	}
}

// Given GitHub's rate limit, when the dispatcher decides, then it books,
// mints and deregisters nothing (queued jobs wait as demand), while
// releases still go out (law 2).
func TestABlockedRoundCallsGitHubForNothingButStillReleases(t *testing.T) {
	l := given(t).add(host("h-a", 4, 4), queued(1), queued(2))
	l.apply(l.decide())
	l.add(completed(2, "", "cancelled"))
	p := params
	p.Blocked = true
	plan := dispatch.Decide(l.f, p)
	if len(plan.Reserve)+len(plan.Mint)+len(plan.Deregister)+len(plan.Cleanup) != 0 {
		t.Fatalf("a blocked round plans GitHub calls: %+v", plan)
	}
	if got := attempts(plan.Release); got[attempt(2, 1)] != events.ReleaseSurplus {
		t.Fatalf("releases %v, want the cancelled job's booking released", got)
	}
	steps := plan.Steps()
	if n := len(events.Calls[dispatch.MintCall](steps)); n != 0 {
		t.Fatalf("%d mint calls in a blocked round", n)
	}
}

// Given GitHub's REST rate limit and two pools with demand, one served
// through a runner scale set (Exempt: its JIT configs come from the actions
// service), when the dispatcher decides, then the scale set's pool is still
// booked and minted for and the other pool waits.
func TestARateLimitedRoundStillBooksAScaleSetsPool(t *testing.T) {
	macos := []string{"self-hosted", "macos"}
	h := host("h-a", 4, 8)
	h.Pools["macos"] = events.PoolSlots{Labels: macos, Slots: 2}
	l := given(t).add(h, queued(1), queued(2, macos...))
	p := params
	p.Blocked = true
	p.Exempt = func(pool string) bool { return pool == "macos" }
	plan := dispatch.Decide(l.f, p)
	if len(plan.Reserve) != 1 || plan.Reserve[0].Pool != "macos" || plan.Reserve[0].JobID != 2 {
		t.Fatalf("bookings %+v, want job 2's in macos alone", plan.Reserve)
	}
	l.apply(plan)
	plan = dispatch.Decide(l.f, p)
	if len(plan.Mint) != 1 || plan.Mint[0].Pool != "macos" {
		t.Fatalf("mints %v, want macos's booking's alone", plan.Mint)
	}
}
