package testkit

import (
	"time"

	"github.com/berth-ci/berth/events"
)

// T0 is when every History starts: fact n of a history is stored at
// T0 + n seconds unless the test moves the clock with At.
var T0 = time.Date(2025, 3, 1, 9, 0, 0, 0, time.UTC)

// Labels is the default pool's label set ("linux") in a History.
var Labels = []string{"linux", "self-hosted"}

// HistoryBuilder writes a history as the log would store it: each fact
// gets the next stream sequence (from 1), the subject and id its payload
// names, source "test", and a time (T0 + its sequence in seconds, or what
// At set). Helpers name facts by job id and attempt number, on pool
// "linux" with Labels, for run id 100; Add takes any other payload.
// It is not safe for concurrent use.
type HistoryBuilder struct {
	evs []events.Event
	at  *time.Time
	n   uint64 // facts added: a grant shares its HostOnline's sequence
}

// History starts an empty history.
func History() *HistoryBuilder { return &HistoryBuilder{} }

// At stamps the facts added from now on with T0+d (the watchdog's tests
// reason in offsets); without At, fact n is at T0 + n seconds.
func (h *HistoryBuilder) At(d time.Duration) *HistoryBuilder {
	at := T0.Add(d)
	h.at = &at
	return h
}

// Add appends payloads as the next facts.
func (h *HistoryBuilder) Add(ps ...events.Payload) *HistoryBuilder {
	for _, p := range ps {
		h.n++
		seq := h.n
		at := T0.Add(time.Duration(seq) * time.Second)
		if h.at != nil {
			at = *h.at
		}
		e := events.New("test", at, p)
		e.Seq = seq
		h.evs = append(h.evs, e)
		if g, ok := GrantOf(e); ok {
			h.evs = append(h.evs, g)
		}
	}
	return h
}

// GrantOf is the operator's grant of exactly what a HostOnline fact
// claims (events.GrantClaim), written by the admin beside it, at the same
// sequence (a grant keeps its own stamp in the fold): what every history
// of a host that should be offered its pools needs, as every harness that
// starts agents grants them (run.GrantAgents). ok is false for any other
// fact.
func GrantOf(e events.Event) (events.Event, bool) {
	o, ok := e.Data.(*events.HostOnline)
	if !ok {
		return events.Event{}, false
	}
	g := events.GrantClaim(*o)
	ge := events.NewBy("test", events.RoleAdmin, e.Time, &g)
	ge.Seq = e.Seq
	return ge, true
}

// ApplyGranted folds e into f, and its grant if it is a HostOnline
// (GrantOf).
func ApplyGranted(f *events.Fleet, e events.Event) {
	f.Apply(e)
	if g, ok := GrantOf(e); ok {
		f.Apply(g)
	}
}

// Events is the history so far, in sequence order (a copy).
func (h *HistoryBuilder) Events() []events.Event { return append([]events.Event(nil), h.evs...) }

// Fleet folds the history so far into a fresh fleet, in sequence order.
func (h *HistoryBuilder) Fleet() *events.Fleet {
	f := events.NewFleet()
	for _, e := range h.evs {
		f.Apply(e)
	}
	return f
}

// HostOnline: host announces pool "linux" with slots and a physical cap,
// with a curve key (so it takes bookings) and the exec backend.
func (h *HistoryBuilder) HostOnline(host string, slots, physical int) *HistoryBuilder {
	return h.Add(HostOnline(host, slots, physical))
}

// Queued: job is queued with labels (Labels when none are given).
func (h *HistoryBuilder) Queued(job int64, labels ...string) *HistoryBuilder {
	return h.Add(&events.JobQueued{JobRef: JobRef(job, labels...)})
}

// Reserved: attempt n of job books a slot of pool "linux" on host.
func (h *HistoryBuilder) Reserved(job int64, n int, host string) *HistoryBuilder {
	return h.Add(&events.SlotReserved{Pool: "linux", Host: host, Attempt: events.AttemptID(job, n), JobID: job, N: n, Labels: Labels})
}

// Placed: attempt n of job is placed on host.
func (h *HistoryBuilder) Placed(job int64, n int, host string) *HistoryBuilder {
	return h.Add(&events.AttemptPlaced{AttemptRef: Attempt(job, n, host), JobID: job, Labels: Labels})
}

// Provisioning: host's agent started creating attempt n of job.
func (h *HistoryBuilder) Provisioning(job int64, n int, host string) *HistoryBuilder {
	return h.Add(&events.AttemptProvisioning{AttemptRef: Attempt(job, n, host)})
}

// RunnerStarted: attempt n of job runs its runner.
func (h *HistoryBuilder) RunnerStarted(job int64, n int, host string) *HistoryBuilder {
	return h.Add(&events.AttemptRunnerStarted{AttemptRef: Attempt(job, n, host)})
}

// Booted: attempt n of job is reserved, placed, provisioning and its runner
// started (not yet bound to a job).
func (h *HistoryBuilder) Booted(job int64, n int, host string) *HistoryBuilder {
	return h.Reserved(job, n, host).Placed(job, n, host).Provisioning(job, n, host).RunnerStarted(job, n, host)
}

// InProgress: job runs on the runner named runner (an attempt id).
func (h *HistoryBuilder) InProgress(job int64, runner string) *HistoryBuilder {
	return h.Add(&events.JobInProgress{JobRef: JobRef(job), RunnerName: runner})
}

// Running: job is queued, booted on host as attempt 1, and in progress on it.
func (h *HistoryBuilder) Running(job int64, host string) *HistoryBuilder {
	return h.Queued(job).Booted(job, 1, host).InProgress(job, events.AttemptID(job, 1))
}

// Completed: job ended with conclusion on runner.
func (h *HistoryBuilder) Completed(job int64, runner, conclusion string) *HistoryBuilder {
	return h.Add(&events.JobCompleted{JobRef: JobRef(job), RunnerName: runner, Conclusion: conclusion})
}

// Released: attempt n of job's slot on host is released for reason.
func (h *HistoryBuilder) Released(job int64, n int, host, reason string) *HistoryBuilder {
	return h.Add(&events.SlotReleased{Pool: "linux", Host: host, Attempt: events.AttemptID(job, n), Reason: reason, JobID: job})
}

// TeardownRequested: attempt n of job on host is to be stopped for reason.
func (h *HistoryBuilder) TeardownRequested(job int64, n int, host, reason string) *HistoryBuilder {
	return h.Add(&events.AttemptTeardownRequested{AttemptRef: Attempt(job, n, host), Reason: reason})
}

// Stopped: attempt n of job's VM on host is gone.
func (h *HistoryBuilder) Stopped(job int64, n int, host string) *HistoryBuilder {
	return h.Add(&events.AttemptStopped{AttemptRef: Attempt(job, n, host)})
}

// Done: job ran on attempt 1 on host, completed with conclusion, and its
// slot was released and its VM stopped.
func (h *HistoryBuilder) Done(job int64, host, conclusion string) *HistoryBuilder {
	a := events.AttemptID(job, 1)
	return h.Running(job, host).Completed(job, a, conclusion).
		Released(job, 1, host, events.ReleaseCompleted).
		TeardownRequested(job, 1, host, events.ReleaseCompleted).Stopped(job, 1, host)
}

// HostOnline is the payload History.HostOnline adds.
func HostOnline(host string, slots, physical int) *events.HostOnline {
	return &events.HostOnline{Host: host, Boot: "boot-1", PhysicalCap: physical, CurveKey: "X" + host, Backend: "exec",
		Pools: map[string]events.PoolSlots{"linux": {Labels: Labels, Slots: slots}}}
}

// JobRef is job's reference in a History: run 100, labels as given or Labels.
func JobRef(job int64, labels ...string) events.JobRef {
	if labels == nil {
		labels = Labels
	}
	return events.JobRef{JobID: job, RunID: 100, Labels: labels}
}

// Attempt is attempt n of job on host, in pool "linux".
func Attempt(job int64, n int, host string) events.AttemptRef {
	return events.AttemptRef{Attempt: events.AttemptID(job, n), Pool: "linux", Host: host}
}
