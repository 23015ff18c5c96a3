package testkit

import (
	"context"
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
	return Poll(t, context.Background(), within, PollEvery, what, func(context.Context) error { return cond() })
}

// Poll is Eventually's general form, for conditions that are calls (a
// command, an HTTP request): cond gets a context that ends when ctx does or
// the window closes, and is tried every interval until it returns nil. The
// test fails with what and cond's last error when the window closes (or ctx
// ends) first. It returns how long the wait took.
func Poll(t testing.TB, ctx context.Context, within, every time.Duration, what string, cond func(context.Context) error) time.Duration {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		err := cond(ctx)
		if err == nil {
			return time.Since(start)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not within %v: %v", what, within, err)
		case <-tick.C:
		}
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
