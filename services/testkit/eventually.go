package testkit

import (
	"errors"
	"testing"
	"time"
)

// PollEvery is how often Eventually and Consistently look at their
// condition: short enough not to slow a test, long enough not to spin.
const PollEvery = 10 * time.Millisecond

// Eventually polls cond every PollEvery until it holds, and fails the test
// (Fatalf, naming what) if it has not held within the given duration.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	EventuallyErr(t, within, what, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	})
}

var errNotYet = errors.New("condition does not hold")

// EventuallyErr polls cond every PollEvery until it returns nil, and fails
// the test with what and cond's last error if it has not within the given
// duration. It returns how long the wait took.
func EventuallyErr(t testing.TB, within time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(within)
	for {
		err := cond()
		if err == nil {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, within, err)
		}
		time.Sleep(PollEvery)
	}
}

// Consistently checks cond every PollEvery for the whole duration and fails
// the test (naming what) the first time it does not hold. It is for "this
// must not happen for a while" (no call, no release): the wait is the
// behaviour under test, stated with its window.
func Consistently(t testing.TB, during time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(during)
	for {
		if !cond() {
			t.Fatalf("%s: stopped holding within %v", what, during)
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(PollEvery)
	}
}
