package clock

import (
	"sort"
	"sync"
	"time"
)

// Fake is a Clock that moves only when told to. Timers and tickers made
// from it fire, in deadline order, as Advance passes their deadlines; each
// fire is a non-blocking send on a channel of one, as with the real ones.
// Safe for concurrent use.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	waiters []*fakeTimer
	// changed is closed and replaced whenever a timer is armed, so a test
	// can wait until the code under test has armed the timer it expects.
	changed chan struct{}
}

// NewFake returns a Fake that reads start.
func NewFake(start time.Time) *Fake { return &Fake{now: start, changed: make(chan struct{})} }

// Now implements Clock.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer implements Clock.
func (f *Fake) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{f: f, c: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

// NewTicker implements Clock.
func (f *Fake) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("clock: non-positive interval for NewTicker")
	}
	t := &fakeTimer{f: f, c: make(chan time.Time, 1), period: d}
	t.Reset(d)
	return fakeTicker{t}
}

type fakeTicker struct{ t *fakeTimer }

func (k fakeTicker) C() <-chan time.Time { return k.t.c }
func (k fakeTicker) Stop()               { k.t.Stop() }

// Advance moves the clock by d, firing every timer whose deadline it
// passes (a ticker as many times as it would have, each send dropped when
// its channel is full, like time.Ticker).
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	end := f.now.Add(d)
	for {
		sort.Slice(f.waiters, func(i, j int) bool { return f.waiters[i].at.Before(f.waiters[j].at) })
		if len(f.waiters) == 0 || f.waiters[0].at.After(end) {
			break
		}
		t := f.waiters[0]
		f.now = t.at
		select {
		case t.c <- t.at:
		default:
		}
		if t.period > 0 {
			t.at = t.at.Add(t.period)
		} else {
			f.waiters = f.waiters[1:]
			t.armed = false
		}
	}
	f.now = end
	f.mu.Unlock()
}

// Set moves the clock to t (forward only; an earlier t is ignored).
func (f *Fake) Set(t time.Time) {
	if d := t.Sub(f.Now()); d > 0 {
		f.Advance(d)
	}
}

// Timers is how many timers and tickers are armed now.
func (f *Fake) Timers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.waiters)
}

// Armed returns a channel closed the next time a timer or ticker is armed
// (made or reset): a test waits on it, with its own deadline, before
// advancing past a timer the code under test is about to arm.
func (f *Fake) Armed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

type fakeTimer struct {
	f      *Fake
	c      chan time.Time
	at     time.Time
	period time.Duration
	armed  bool
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	return t.unarm()
}

func (t *fakeTimer) unarm() bool {
	if !t.armed {
		return false
	}
	for i, w := range t.f.waiters {
		if w == t {
			t.f.waiters = append(t.f.waiters[:i], t.f.waiters[i+1:]...)
			break
		}
	}
	t.armed = false
	return true
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	was := t.unarm()
	if t.period > 0 && d > 0 {
		t.period = d
	}
	t.at = t.f.now.Add(d)
	t.armed = true
	t.f.waiters = append(t.f.waiters, t)
	close(t.f.changed)
	t.f.changed = make(chan struct{})
	return was
}
