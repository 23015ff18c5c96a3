package sealing_test

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-ci/berth/services/sealing"
	"github.com/nats-io/nkeys"
)

func keys(t *testing.T) (nkeys.KeyPair, string) {
	t.Helper()
	kp, err := nkeys.CreateCurveKeys()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	return kp, pub
}

// What a dispatcher seals opens only for its host, from a trusted sender,
// for the placement it was sealed for.
func TestASealedPlacementOpensOnlyTrustedAndMatching(t *testing.T) {
	dispatcher, dpub := keys(t)
	agent, apub := keys(t)
	p := sealing.Placement{Attempt: "berth-7-1", Host: "h-a", Pool: "linux", JobID: 7, BookedSeq: 3, JIT: []byte("jit")}
	sealed, err := sealing.Seal(dispatcher, apub, p)
	if err != nil {
		t.Fatal(err)
	}
	trusted := func(k string) (bool, error) { return k == dpub, nil }
	want := p
	want.JIT, want.BookedSeq = nil, 0
	if jit, err := sealing.Open(agent, sealed, dpub, trusted, want); err != nil || string(jit) != "jit" {
		t.Fatalf("open: %q, %v", jit, err)
	}
	if _, err := sealing.Open(agent, sealed, dpub, func(string) (bool, error) { return false, nil }, want); !errors.Is(err, sealing.ErrUntrusted) {
		t.Fatalf("an untrusted sender opened: %v", err)
	}
	other := want
	other.Attempt = "berth-8-1"
	if _, err := sealing.Open(agent, sealed, dpub, trusted, other); !errors.Is(err, sealing.ErrMismatch) {
		t.Fatalf("a config sealed for another attempt opened: %v", err)
	}
	unbooked, _ := sealing.Seal(dispatcher, apub, sealing.Placement{Attempt: "berth-7-1", Host: "h-a", Pool: "linux", JobID: 7, JIT: []byte("jit")})
	if _, err := sealing.Open(agent, unbooked, dpub, trusted, want); !errors.Is(err, sealing.ErrMismatch) {
		t.Fatalf("a placement naming no booking opened: %v", err)
	}
	raw, _ := dispatcher.Seal([]byte("jit"), apub)
	if _, err := sealing.Open(agent, raw, dpub, trusted, want); !errors.Is(err, sealing.ErrMismatch) {
		t.Fatalf("a bare JIT config (no placement bound) opened: %v", err)
	}
}

// A key kept in a seed file is the same key after a restart.
func TestLoadKeyKeepsTheKeyAcrossRestarts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "d", "curve.seed")
	a, err := sealing.LoadKey(path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := sealing.LoadKey(path)
	if err != nil {
		t.Fatal(err)
	}
	pa, _ := a.PublicKey()
	pb, _ := b.PublicKey()
	if pa != pb {
		t.Fatalf("key changed across loads: %s, %s", pa, pb)
	}
}

// A placement sealed here opens with nkeys' own KeyPair.Open, and a box
// nkeys sealed opens here: the shared key kept between boxes changes no
// byte of the NATS xkeys format. A box for another key opens for nobody.
func TestSealedBytesAreNATSXKeysBothWays(t *testing.T) {
	dispatcher, dpub := keys(t)
	agent, apub := keys(t)
	p := sealing.Placement{Attempt: "berth-7-1", Host: "h-a", Pool: "linux", JobID: 7, BookedSeq: 3, JIT: []byte("jit")}
	for range 2 { // the second time through the kept shared key
		sealed, err := sealing.Seal(dispatcher, apub, p)
		if err != nil {
			t.Fatal(err)
		}
		if b, err := agent.Open(sealed, dpub); err != nil || !strings.Contains(string(b), `"attempt":"berth-7-1"`) {
			t.Fatalf("nkeys could not open what Seal sealed: %q, %v", b, err)
		}
		viaNKeys, _ := json.Marshal(p)
		boxed, err := dispatcher.Seal(viaNKeys, apub)
		if err != nil {
			t.Fatal(err)
		}
		want := p
		if jit, err := sealing.Open(agent, boxed, dpub, nil, want); err != nil || string(jit) != "jit" {
			t.Fatalf("Open could not open what nkeys sealed: %q, %v", jit, err)
		}
		stranger, _ := keys(t)
		if _, err := sealing.Open(stranger, boxed, dpub, nil, want); err == nil {
			t.Fatal("a box sealed to the agent opened with another key")
		}
	}
}

// BenchmarkSealAndOpen is one placement sealed by a dispatcher and opened
// by its host, as every job costs.
func BenchmarkSealAndOpen(b *testing.B) {
	dispatcher, _ := nkeys.CreateCurveKeys()
	dpub, _ := dispatcher.PublicKey()
	agent, _ := nkeys.CreateCurveKeys()
	apub, _ := agent.PublicKey()
	p := sealing.Placement{Attempt: "berth-7-1", Host: "h-a", Pool: "linux", JobID: 7, BookedSeq: 3, JIT: make([]byte, 2048)}
	b.ReportAllocs()
	for b.Loop() {
		sealed, err := sealing.Seal(dispatcher, apub, p)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := sealing.Open(agent, sealed, dpub, nil, p); err != nil {
			b.Fatal(err)
		}
	}
}
