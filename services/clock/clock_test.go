package clock_test

import (
	"testing"
	"time"

	"github.com/berth-ci/berth/services/clock"
)

func fired(c <-chan time.Time) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func TestFakeTimerFiresOnlyWhenAdvancedPastItsDeadline(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	tm := f.NewTimer(10 * time.Minute)
	f.Advance(9 * time.Minute)
	if fired(tm.C()) {
		t.Fatal("fired a minute early")
	}
	f.Advance(time.Minute)
	if !fired(tm.C()) {
		t.Fatal("did not fire at its deadline")
	}
	if f.Timers() != 0 {
		t.Fatalf("a fired timer stays armed: %d", f.Timers())
	}
}

func TestFakeTickerTicksAndStops(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	tk := f.NewTicker(time.Second)
	f.Advance(3 * time.Second) // three ticks, two dropped on a full channel
	if !fired(tk.C()) || fired(tk.C()) {
		t.Fatal("want exactly one buffered tick")
	}
	tk.Stop()
	f.Advance(time.Hour)
	if fired(tk.C()) || f.Timers() != 0 {
		t.Fatal("a stopped ticker ticked")
	}
}

func TestFakeStopAndResetReportWhetherArmed(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	tm := f.NewTimer(time.Second)
	if !tm.Stop() || tm.Stop() {
		t.Fatal("Stop should report true once, then false")
	}
	armed := f.Armed()
	if tm.Reset(time.Second) {
		t.Fatal("Reset of a stopped timer reported it armed")
	}
	select {
	case <-armed:
	default:
		t.Fatal("Armed was not signalled by Reset")
	}
	if got := f.Now(); !got.Equal(time.Unix(0, 0)) {
		t.Fatalf("Now moved without Advance: %v", got)
	}
}
