package vmagent_test

import (
	"context"
	"strings"
	"testing"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/sealing"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/services/trust"
	"github.com/berth-ci/berth/services/vmagent"
	"github.com/nats-io/nkeys"
)

// Given an agent that trusts only the dispatcher keys in berth_trust, when
// a placement arrives sealed by a key no admin trusted (a forged one,
// sealed with a fresh key), then the agent refuses it: the attempt fails
// at open_jit saying why, and no VM is created. A placement the trusted
// key sealed runs; one sealed for another attempt is refused too (law 10;
// issue 16).
func TestAnAgentOpensOnlyPlacementsATrustedDispatcherSealedForThem(t *testing.T) {
	t.Parallel()
	var set trust.Set
	h := newHarness(t, func(o *vmagent.Options) { o.Trust = &set })
	set.JS = h.js
	trusted, _ := h.sealer.PublicKey()
	if err := trust.AddDispatcher(context.Background(), h.js, trusted, "the test's dispatcher"); err != nil {
		t.Fatal(err)
	}

	// A trusted, matching placement runs.
	h.place(t, h.host, "berth-120-1", 120, []byte("jit"))
	h.wait(t, "berth-120-1", events.TypeAttemptRunnerStarted)

	// A forged one, sealed with a fresh key, is refused before any create.
	orig := h.sealer
	forger, _ := nkeys.CreateCurveKeys()
	h.sealer = forger
	h.place(t, h.host, "berth-121-1", 121, []byte("jit"))
	f := h.wait(t, "berth-121-1", events.TypeAttemptFailed).Data.(*events.AttemptFailed)
	if f.Step != "open_jit" || !strings.Contains(f.Error, "not a trusted dispatcher") {
		t.Fatalf("failed %q: %q, want open_jit naming the untrusted sealer", f.Step, f.Error)
	}

	// A trusted key's sealed config replayed into another attempt's
	// placement is refused as well.
	sealed, err := sealing.Seal(orig, h.agentKey, sealing.Placement{Attempt: "berth-120-1", Host: h.host, Pool: "linux", JobID: 120, BookedSeq: 1, JIT: []byte("jit")})
	if err != nil {
		t.Fatal(err)
	}
	r := events.AttemptRef{Attempt: "berth-122-1", Pool: "linux", Host: h.host}
	h.append(t, events.SlotReserved{Pool: "linux", Host: h.host, Attempt: r.Attempt, JobID: 122, N: 1})
	h.append(t, events.AttemptPlaced{AttemptRef: r, JobID: 122, RunnerID: 1220, SealedJIT: sealed, SealedBy: trusted, SealedTo: h.agentKey})
	f = h.wait(t, "berth-122-1", events.TypeAttemptFailed).Data.(*events.AttemptFailed)
	if !strings.Contains(f.Error, "does not match") {
		t.Fatalf("failed %q: %q, want a mismatch refusal", f.Step, f.Error)
	}
	for _, a := range []string{"berth-121-1", "berth-122-1"} {
		if n := len(h.be.Calls(testkit.StepCreate, a)); n != 0 {
			t.Errorf("%s: create called %d times for a refused placement", a, n)
		}
	}
}
