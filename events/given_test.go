package events_test

import (
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
)

// Histories for the example tests: each fact is stamped with its stream
// sequence and a time, so a test can apply them in any order.

var t0 = time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)

// ev stamps a payload as the fact stored at seq, sec seconds after t0.
func ev(seq uint64, sec int, p events.Payload) events.Event {
	e := events.New("test", t0.Add(time.Duration(sec)*time.Second), p)
	e.Seq = seq
	return e
}

// given folds a history in the order given, each host granted what it
// announces, as an operator grants the hosts it runs (grantFor).
func given(evs ...events.Event) *events.Fleet {
	f := events.NewFleet()
	for _, e := range evs {
		apply(f, e)
	}
	return f
}

// ungranted folds a history as given: no host is granted unless a
// HostGranted in it says so.
func ungranted(evs ...events.Event) *events.Fleet {
	f := events.NewFleet()
	for _, e := range evs {
		f.Apply(e)
	}
	return f
}

// apply folds e into f, and the operator's grant of what it claims if it
// is a HostOnline (grantFor).
func apply(f *events.Fleet, e events.Event) {
	f.Apply(e)
	if g, ok := grantFor(e); ok {
		f.Apply(g)
	}
}

// grantFor is the admin's grant of exactly what a HostOnline fact claims,
// stored beside it (the same sequence: a grant has its own stamp); ok is
// false for any other fact.
func grantFor(e events.Event) (events.Event, bool) {
	o, ok := e.Data.(*events.HostOnline)
	if !ok {
		return events.Event{}, false
	}
	gr := events.GrantClaim(*o)
	g := events.NewBy("admin", events.RoleAdmin, e.Time, &gr)
	g.Seq = e.Seq
	return g, true
}

// script numbers facts in the order they are written: seq n at t0 + n seconds.
type script struct{ evs []events.Event }

func (s *script) add(p events.Payload) events.Event {
	n := len(s.evs) + 1
	e := ev(uint64(n), n, p)
	s.evs = append(s.evs, e)
	return e
}

func hostOnline(host string, physical int, pools map[string]int) *events.HostOnline {
	h := &events.HostOnline{Host: host, Boot: "boot-1", PhysicalCap: physical, Backend: "exec",
		Pools: map[string]events.PoolSlots{}}
	for name, n := range pools {
		h.Pools[name] = events.PoolSlots{Labels: []string{"self-hosted", name}, Slots: n}
	}
	return h
}

func job(id int64, labels ...string) events.JobRef {
	return events.JobRef{JobID: id, RunID: 1, Labels: labels}
}

func ref(attempt, pool, host string) events.AttemptRef {
	return events.AttemptRef{Attempt: attempt, Pool: pool, Host: host}
}

func reserve(attempt, pool, host string, jobID int64) *events.SlotReserved {
	return &events.SlotReserved{Pool: pool, Host: host, Attempt: attempt, JobID: jobID, N: 1, Labels: []string{pool}}
}

func release(attempt, pool, host, reason string) *events.SlotReleased {
	return &events.SlotReleased{Pool: pool, Host: host, Attempt: attempt, Reason: reason}
}

func rules(vs []events.Violation) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Rule)
	}
	return out
}

func poolStatus(t *testing.T, f *events.Fleet, name string) events.PoolStatus {
	t.Helper()
	for _, p := range f.Status().Pools {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("pool %s not in status", name)
	return events.PoolStatus{}
}
