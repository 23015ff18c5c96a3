package eventlog_test

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/clock"
	"github.com/berth-ci/berth/services/eventlog"
)

// foldView is what a refused fact must not change.
func foldView(t *testing.T, f *events.Fleet) string {
	b, err := json.Marshal([]any{f.Jobs, f.Attempts, f.Hosts})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// FuzzShellRefusesWhatTheSubjectDoesNotConfirm feeds the shell stored
// messages with random subjects and payloads on top of a real history: a
// message the catalogue's authority refuses (or cannot decode) leaves the
// fold as it was, and whatever is folded keeps the fold's invariants.
func FuzzShellRefusesWhatTheSubjectDoesNotConfirm(f *testing.F) {
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	seed := func(p events.Payload, subject string) {
		e := events.New("fuzz", at, p)
		b, _ := events.Marshal(e)
		f.Add(subject, b)
	}
	ref := events.AttemptRef{Attempt: "berth-7-1", Pool: "linux", Host: "host-a"}
	seed(events.SlotReleased{Pool: "linux", Host: "host-a", Attempt: "berth-7-1", Reason: "completed"}, "berth.evt.pool.linux.agent")
	seed(events.SlotReleased{Pool: "linux", Host: "host-a", Attempt: "berth-7-1", Reason: "completed"}, "berth.evt.pool.linux.watchdog")
	seed(events.HostOnline{Host: "host-b", CurveKey: "XA"}, "berth.evt.host.host-a.agent")
	seed(events.HostLost{HostChange: events.HostChange{Host: "host-a"}}, "berth.evt.host.host-a.watchdog")
	seed(events.AttemptPlaced{AttemptRef: ref, JobID: 7}, "berth.evt.attempt.host-a.berth-7-1.agent")
	seed(events.JobCompleted{JobRef: events.JobRef{JobID: 7}, RunnerName: "berth-7-1"}, "berth.evt.job.7")
	seed(events.JobCompleted{JobRef: events.JobRef{JobID: 7}}, "berth.evt.job.8")
	f.Add("berth.evt.pool.linux", []byte(`{"specversion":"1.0","id":"x","type":"berth.slot.released.v1","data":null}`))
	f.Fuzz(func(t *testing.T, subject string, body []byte) {
		s := eventlog.NewShell(nil, nil, clock.NewFake(at), slog.New(slog.NewTextHandler(io.Discard, nil)))
		online := events.HostOnline{Host: "host-a", PhysicalCap: 2, CurveKey: "X", Pools: map[string]events.PoolSlots{"linux": {Slots: 1}}}
		granted := events.GrantClaim(online)
		history := []events.Payload{
			&online, &granted,
			&events.JobQueued{JobRef: events.JobRef{JobID: 7, Labels: []string{"linux"}}},
			&events.SlotReserved{Pool: "linux", Host: "host-a", Attempt: ref.Attempt, JobID: 7, N: 1},
			&events.AttemptPlaced{AttemptRef: ref, JobID: 7, RunnerID: 1},
		}
		for i, p := range history {
			e := events.New("test", at, p)
			e.Seq = uint64(i + 1)
			s.Apply(eventlog.Delivered{Event: e})
		}
		before := foldView(t, s.Fold)
		d := eventlog.Delivered{}
		e, err := events.Unmarshal(body, 5)
		d.Event, d.Err = e, err
		d.Event.Seq, d.Event.Subject = 5, subject
		_, authErr := events.Authorize(d.Event)
		s.Apply(d)
		if err != nil || authErr != nil {
			if got := foldView(t, s.Fold); got != before {
				t.Fatalf("a refused or unreadable message (%v / %v) on %q changed the fold", err, authErr, subject)
			}
			if authErr != nil && err == nil && !errors.Is(authErr, events.ErrForged) {
				t.Fatalf("refusal is not ErrForged: %v", authErr)
			}
		}
		if vs := s.Fold.Check(); len(vs) > 0 {
			t.Fatalf("invariants broken after %q on %q: %v", body, subject, vs)
		}
	})
}
