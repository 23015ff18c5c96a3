// Package sealing is how a JIT config travels through the log: the
// dispatcher seals it, bound to the attempt it was minted for and the
// booking that holds its slot, to the placed host's curve key (NATS xkeys:
// X25519 + XSalsa20-Poly1305, authenticated by the sender's key); the
// host's agent opens it only when the sender is a dispatcher the fleet
// trusts (package trust) and what it opens matches the placement it came
// in. A secret never enters the log in clear, and a credential that can
// write a placement cannot make an agent start a runner for it.
package sealing

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/nacl/box"
)

// Placement is the sealed plaintext: a JIT config and what it is for.
type Placement struct {
	Attempt string `json:"attempt"`
	Host    string `json:"host"`
	Pool    string `json:"pool"`
	JobID   int64  `json:"job_id"`
	// BookedSeq is the stream sequence of the ledger fact that holds the
	// attempt's slot (its booking, or a warm VM's claim): law 1, attested
	// by the dispatcher that read it.
	BookedSeq uint64 `json:"booked_seq"`
	JIT       []byte `json:"jit"`
}

// ErrUntrusted: the placement was sealed by a key the fleet does not trust.
var ErrUntrusted = errors.New("placement sealed by a key that is not a trusted dispatcher's")

// ErrMismatch: what was sealed is not what the placement says.
var ErrMismatch = errors.New("sealed placement does not match the placement it came in")

// Seal seals p with the dispatcher's curve key kp to the agent's curve
// public key to.
func Seal(kp nkeys.KeyPair, to string, p Placement) ([]byte, error) {
	b, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	k, err := sharedKey(kp, to)
	if err != nil {
		return nil, fmt.Errorf("seal to %s: %w", to, err)
	}
	var nonce [nonceLen]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(xkeyVersion)+nonceLen+box.Overhead+len(b))
	out = append(append(out, xkeyVersion...), nonce[:]...)
	return box.SealAfterPrecomputation(out, b, &nonce, k), nil
}

// The NATS xkeys (nkeys xkeys.go, XKeyVersionV1) wire format a sealed
// placement keeps: "xkv1", a 24-byte nonce, then the NaCl box. nkeys'
// KeyPair.Seal and Open read and write the same bytes.
const (
	xkeyVersion = "xkv1"
	nonceLen    = 24
)

// shared holds the X25519 shared key of each pair of curve keys met, by
// (own key pair, peer public key). Computing it (box.Precompute) is the
// cost of a seal or an open, and so is a curve key pair's PublicKey (a
// scalar multiplication each call); nkeys does both for every box. A
// process holds one key pair and a fleet few peers (its trusted
// dispatchers, its hosts), so the map stays small.
var shared sync.Map

type pair struct {
	own  nkeys.KeyPair // a pointer in nkeys: compared by identity
	peer string
}

func sharedKey(kp nkeys.KeyPair, peer string) (*[32]byte, error) {
	id := pair{kp, peer}
	if k, ok := shared.Load(id); ok {
		return k.(*[32]byte), nil
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, err
	}
	_, priv, err := nkeys.DecodeSeed(seed)
	if err != nil || len(priv) != 32 {
		return nil, fmt.Errorf("not a curve key: %v", err)
	}
	pub, err := nkeys.Decode(nkeys.PrefixByteCurve, []byte(peer))
	if err != nil || len(pub) != 32 {
		return nil, fmt.Errorf("%s is not a curve public key: %v", peer, err)
	}
	var k, privA, pubA [32]byte
	copy(privA[:], priv)
	copy(pubA[:], pub)
	box.Precompute(&k, &pubA, &privA)
	shared.Store(id, &k)
	return &k, nil
}

// open is nkeys' KeyPair.Open with the shared key kept.
func open(kp nkeys.KeyPair, sealed []byte, by string) ([]byte, error) {
	if len(sealed) <= len(xkeyVersion)+nonceLen || !bytes.HasPrefix(sealed, []byte(xkeyVersion)) {
		return nil, nkeys.ErrInvalidEncrypted
	}
	k, err := sharedKey(kp, by)
	if err != nil {
		return nil, err
	}
	var nonce [nonceLen]byte
	copy(nonce[:], sealed[len(xkeyVersion):])
	b, ok := box.OpenAfterPrecomputation(nil, sealed[len(xkeyVersion)+nonceLen:], &nonce, k)
	if !ok {
		return nil, nkeys.ErrCouldNotDecrypt
	}
	return b, nil
}

// Open opens a sealed placement with the agent's curve key kp. by is the
// sender's curve public key (the fact's sealed_by); trusted says whether it
// is a trusted dispatcher's (an error from it is returned as is: not
// knowing is not a refusal); want is what the placement fact says. It
// returns the JIT config, or an error wrapping ErrUntrusted or ErrMismatch
// that says why it was refused.
func Open(kp nkeys.KeyPair, sealed []byte, by string, trusted func(string) (bool, error), want Placement) ([]byte, error) {
	if trusted != nil {
		ok, err := trusted(by)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("%w: %s (the admin trusts a dispatcher with `berth trust add`)", ErrUntrusted, by)
		}
	}
	b, err := open(kp, sealed, by)
	if err != nil {
		return nil, fmt.Errorf("open the sealed JIT config: %w", err)
	}
	var got Placement
	if err := json.Unmarshal(b, &got); err != nil {
		return nil, fmt.Errorf("%w: not a sealed placement: %v", ErrMismatch, err)
	}
	switch {
	case got.Attempt != want.Attempt || got.Host != want.Host || got.Pool != want.Pool || got.JobID != want.JobID:
		return nil, fmt.Errorf("%w: sealed for %s on %s (pool %s, job %d), placed as %s on %s (pool %s, job %d)", ErrMismatch,
			got.Attempt, got.Host, got.Pool, got.JobID, want.Attempt, want.Host, want.Pool, want.JobID)
	case got.BookedSeq == 0:
		return nil, fmt.Errorf("%w: no booking named", ErrMismatch)
	case len(got.JIT) == 0:
		return nil, fmt.Errorf("%w: no JIT config", ErrMismatch)
	}
	return got.JIT, nil
}

// LoadKey loads a curve key from its seed file, or makes one and keeps it
// there (mode 0600, its directory made 0700): an agent's key, so placements
// sealed before a restart can still be opened; a dispatcher's, so the key
// the admin trusts survives a restart. "" makes a fresh key each time.
func LoadKey(path string) (nkeys.KeyPair, error) {
	if path == "" {
		return nkeys.CreateCurveKeys()
	}
	if seed, err := os.ReadFile(path); err == nil {
		kp, err := nkeys.FromCurveSeed(seed)
		if err != nil {
			return nil, fmt.Errorf("curve key %s is corrupt: %w (delete it: a new key is made at start; placements in flight are retried, and a dispatcher's new key must be trusted again)", path, err)
		}
		return kp, nil
	}
	kp, err := nkeys.CreateCurveKeys()
	if err != nil {
		return nil, err
	}
	seed, _ := kp.Seed()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("curve key: %w", err)
	}
	if err := os.WriteFile(path, seed, 0o600); err != nil {
		return nil, fmt.Errorf("save curve key: %w", err)
	}
	return kp, nil
}
