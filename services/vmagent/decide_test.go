package vmagent_test

import (
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/vmagent"
)

var t0 = time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)

// history folds facts stored at seq 1, 2, … one second apart.
func history(ps ...events.Payload) *events.Fleet {
	f := events.NewFleet()
	for i, p := range ps {
		e := events.New("test", t0.Add(time.Duration(i)*time.Second), p)
		e.Seq = uint64(i + 1)
		f.Apply(e)
	}
	return f
}

func at(n int) events.AttemptRef {
	return events.AttemptRef{Attempt: events.AttemptID(int64(n), 1), Pool: "linux", Host: "h-a"}
}

func placed(n int) []events.Payload {
	r := at(n)
	return []events.Payload{
		&events.SlotReserved{Pool: "linux", Host: "h-a", Attempt: r.Attempt, JobID: int64(n), N: 1},
		&events.AttemptPlaced{AttemptRef: r, JobID: int64(n), RunnerID: int64(n)},
	}
}

func local() vmagent.Local {
	return vmagent.Local{Host: "h-a", Now: t0.Add(time.Hour), Creating: map[string]bool{}, Stopping: map[string]bool{},
		RetryAt: map[string]time.Time{}, InFlight: func(string) bool { return false }}
}

func online() events.Payload {
	return &events.HostOnline{Host: "h-a", Boot: "b", PhysicalCap: 2, CurveKey: "X",
		Pools: map[string]events.PoolSlots{"linux": {Slots: 2}}}
}

// The agent's decisions, given a history and what it sees locally (no
// NATS, no backend, no goroutine): each row is one field situation.
func TestAgentDecide(t *testing.T) {
	for _, tc := range []struct {
		name           string
		history        []events.Payload
		local          func(*vmagent.Local)
		creates, stops int
		facts          []string // event types, in order
		announce       bool
	}{
		{name: "a placement is created", history: placed(1), creates: 1},
		{name: "a placement on another host is not ours",
			history: []events.Payload{&events.AttemptPlaced{AttemptRef: events.AttemptRef{Attempt: "x", Pool: "linux", Host: "h-b"}}}},
		{name: "a create already running is not started twice", history: placed(1),
			local: func(l *vmagent.Local) { l.Creating[at(1).Attempt] = true }},
		{name: "a provisioning fact on its way counts as created", history: placed(1),
			local: func(l *vmagent.Local) {
				id := events.AttemptProvisioning{AttemptRef: at(1)}.EventID()
				l.InFlight = func(e string) bool { return e == id }
			}},
		{name: "a drain gives an unstarted placement back without a create", history: placed(1),
			local: func(l *vmagent.Local) { l.Draining = true }, facts: []string{events.TypeAttemptFailed}},
		{name: "a teardown of a VM never created is done at once",
			history: append(placed(1), &events.AttemptTeardownRequested{AttemptRef: at(1)}),
			facts:   []string{events.TypeAttemptStopped}},
		{name: "a teardown of a created VM stops it",
			history: append(placed(1), &events.AttemptProvisioning{AttemptRef: at(1)}, &events.AttemptTeardownRequested{AttemptRef: at(1)}),
			stops:   1},
		{name: "a failed stop waits for its back-off",
			history: append(placed(1), &events.AttemptProvisioning{AttemptRef: at(1)}, &events.AttemptTeardownRequested{AttemptRef: at(1)}),
			local:   func(l *vmagent.Local) { l.RetryAt[at(1).Attempt] = l.Now.Add(time.Second) }},
		{name: "an abandoned VM is stopped again after its back-off",
			history: append(placed(1), &events.AttemptProvisioning{AttemptRef: at(1)}, &events.AttemptAbandoned{AttemptRef: at(1), Step: "stop"}),
			local:   func(l *vmagent.Local) { l.RetryAt[at(1).Attempt] = l.Now.Add(-time.Second) }, stops: 1},
		{name: "a drain's timeout stops what runs",
			history: append(placed(1), &events.AttemptProvisioning{AttemptRef: at(1)}, &events.AttemptRunnerStarted{AttemptRef: at(1)}),
			local:   func(l *vmagent.Local) { l.ForceStop = true }, stops: 1},
		{name: "a host the log calls lost is announced again", history: []events.Payload{online()},
			local: func(l *vmagent.Local) { l.HostLost = true }, announce: true},
		{name: "but not more than every few seconds", history: []events.Payload{online()},
			local: func(l *vmagent.Local) { l.HostLost, l.Reannounced = true, l.Now.Add(-time.Second) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := local()
			if tc.local != nil {
				tc.local(&l)
			}
			plan := vmagent.Decide(history(tc.history...), l)
			if n := len(events.Calls[vmagent.CreateCall](plan)); n != tc.creates {
				t.Errorf("%d creates, want %d", n, tc.creates)
			}
			if n := len(events.Calls[vmagent.StopCall](plan)); n != tc.stops {
				t.Errorf("%d stops, want %d", n, tc.stops)
			}
			if n := len(events.Calls[vmagent.AnnounceCall](plan)); (n == 1) != tc.announce {
				t.Errorf("%d announcements, want announce=%v", n, tc.announce)
			}
			var facts []string
			for _, s := range plan {
				if s.Fact != nil {
					facts = append(facts, s.Fact.EventType())
				}
			}
			if len(facts) != len(tc.facts) || (len(facts) > 0 && facts[0] != tc.facts[0]) {
				t.Errorf("facts %v, want %v", facts, tc.facts)
			}
		})
	}
}
