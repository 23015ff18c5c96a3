// Package clock is the one source of time for Berth's loops and deadlines.
// Production code takes a Clock (Real by default); tests drive a Fake, so a
// deadline of ten minutes passes in one call to Advance, with no sleep.
package clock

import "time"

// Clock tells the time and makes timers and tickers that follow it.
type Clock interface {
	Now() time.Time
	// NewTimer fires once, d after now (on a Fake: once Advance passes it).
	NewTimer(d time.Duration) Timer
	// NewTicker fires every d; like time.Ticker it drops ticks a slow
	// reader misses. d must be > 0.
	NewTicker(d time.Duration) Ticker
}

// Timer is a one-shot timer (time.Timer's shape, C as a method).
type Timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// Ticker is a periodic timer (time.Ticker's shape, C as a method).
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// Real is the wall clock.
var Real Clock = real{}

// Or returns c, or Real when c is nil, so a zero Options means wall time.
func Or(c Clock) Clock {
	if c == nil {
		return Real
	}
	return c
}

// Since is c.Now().Sub(t).
func Since(c Clock, t time.Time) time.Duration { return c.Now().Sub(t) }

type real struct{}

func (real) Now() time.Time { return time.Now() }

func (real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

func (real) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time        { return r.t.C }
func (r realTimer) Stop() bool                 { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }

type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time { return r.t.C }
func (r realTicker) Stop()               { r.t.Stop() }

// WithNow is a Clock that reads now and makes real timers: for callers
// that already take a `func() time.Time` for their decisions.
func WithNow(now func() time.Time) Clock {
	if now == nil {
		return Real
	}
	return withNow{now}
}

type withNow struct{ now func() time.Time }

func (w withNow) Now() time.Time                 { return w.now() }
func (withNow) NewTimer(d time.Duration) Timer   { return Real.NewTimer(d) }
func (withNow) NewTicker(d time.Duration) Ticker { return Real.NewTicker(d) }
