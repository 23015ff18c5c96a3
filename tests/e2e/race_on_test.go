//go:build race

package e2e

// raceEnabled: the race detector slows the system about tenfold, so the
// largest runs shrink under it (make test runs them again without it).
const raceEnabled = true
