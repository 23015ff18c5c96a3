package events_test

import (
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
)

// Law 10: order comes from the log's sequence, never from a writer's clock.
// A host fact stamped an hour ahead is only as new as where the log stored
// it: it neither wins nor loses by its time.

// Given a HostLost stamped an hour in the future (a watchdog whose clock
// runs ahead), when the agent re-announces itself after it (five times, its
// clock right), then the host is online after the first re-announcement, in
// whatever order and multiplicity the facts are folded.
func TestAHostLostFromTheFutureDoesNotOutliveTheReannouncement(t *testing.T) {
	lost := &events.HostLost{HostChange: events.HostChange{Host: "h1", Reason: "no heartbeat", At: t0.Add(time.Hour)}}
	h := []events.Event{ev(1, 0, hostOnline("h1", 2, map[string]int{"linux": 1})), ev(2, 3600, lost)}
	for i := 0; i < 5; i++ {
		back := hostOnline("h1", 2, map[string]int{"linux": 1})
		back.Boot = "boot-2"
		back.At = t0.Add(time.Duration(10+i) * time.Second)
		h = append(h, ev(uint64(3+i), 10+i, back))
		for _, order := range [][]events.Event{h, reversed(h), append(append([]events.Event(nil), h...), h...)} {
			f := given(order...)
			if got := f.Hosts["h1"]; got.State != events.HostStateOnline || got.Boot != "boot-2" || !got.Accepts() {
				t.Fatalf("after %d re-announcements: host %s (boot %s), want online on boot-2", i+1, got.State, got.Boot)
			}
		}
	}
}

// Given a host online stamped an hour in the future (an agent whose clock
// runs ahead), when the watchdog declares it lost after that (its clock
// right), then the host is lost: the future stamp does not keep it online.
func TestAnAnnouncementFromTheFutureDoesNotOutliveALaterLoss(t *testing.T) {
	ahead := hostOnline("h1", 2, map[string]int{"linux": 1})
	ahead.At = t0.Add(time.Hour)
	lost := &events.HostLost{HostChange: events.HostChange{Host: "h1", Reason: "no heartbeat", At: t0.Add(time.Minute)}}
	h := []events.Event{ev(1, 3600, ahead), ev(2, 60, lost)}
	for _, order := range [][]events.Event{h, reversed(h)} {
		if got := given(order...).Hosts["h1"]; got.State != events.HostStateLost || got.Accepts() {
			t.Fatalf("host %s, want lost: the loss came later in the log", got.State)
		}
	}
	// Cordons follow the log the same way: an uncordon stored after a
	// cordon stamped in the future lifts it.
	cordon := &events.HostCordoned{HostChange: events.HostChange{Host: "h1", Reason: "maintenance", By: "ops", At: t0.Add(time.Hour)}}
	lift := &events.HostUncordoned{HostChange: events.HostChange{Host: "h1", By: "ops", At: t0.Add(2 * time.Minute)}}
	h = append(h, ev(3, 3600, cordon), ev(4, 120, lift))
	for _, order := range [][]events.Event{h, reversed(h)} {
		if got := given(order...).Hosts["h1"]; got.Cordoned {
			t.Fatalf("host still cordoned (%q) after an uncordon stored later", got.CordonReason)
		}
	}
}

func reversed(h []events.Event) []events.Event {
	out := make([]events.Event, 0, len(h))
	for i := len(h) - 1; i >= 0; i-- {
		out = append(out, h[i])
	}
	return out
}
