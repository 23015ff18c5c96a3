package ghsim

import "slices"

// MintedSecrets returns every encoded JIT config handed out so far and the
// runner token inside each: what must never appear in clear in Berth's log,
// KV buckets or service logs.
func (s *Sim) MintedSecrets() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.minted)
}
