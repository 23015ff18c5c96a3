package events_test

import (
	"fmt"
	"time"

	"github.com/berth-ci/berth/events"
	"pgregory.net/rapid"
)

// The model below writes only valid histories: it books a slot only when the
// host has a free slot of the pool and physical room, releases each
// reservation exactly once and before any teardown, and binds runners to jobs
// one to one (a runner may take a job other than the one it was booked for).

var poolLabels = map[string][]string{
	"linux": {"self-hosted", "linux", "x64"},
	"macos": {"self-hosted", "macos", "arm64"},
}

type mJob struct {
	ref      events.JobRef
	pool     string
	status   events.JobStatus
	runner   string
	attempts int
	unsched  bool
}

type mAttempt struct {
	ref                                events.AttemptRef
	job                                int64
	took                               int64 // job its runner took
	placed, prov, started, failed      bool
	released, teardown, stopped, aband bool
	deregistered                       bool // its runner registration deleted
	bound                              bool // the dispatcher recorded the job its runner took (AttemptBound)
}

func (a *mAttempt) held() bool   { return !a.released }
func (a *mAttempt) booked() bool { return (a.held() || a.prov) && !a.stopped }

type mHost struct {
	name     string
	slots    map[string]int
	physical int
	cordoned bool
	degraded bool
	boots    int
}

// online is the host's advertisement after its agent (re)starts.
func (h *mHost) online() *events.HostOnline {
	h.boots++
	o := &events.HostOnline{Host: h.name, Boot: fmt.Sprintf("boot-%d", h.boots), PhysicalCap: h.physical,
		Pools: map[string]events.PoolSlots{}}
	for pool, n := range h.slots {
		o.Pools[pool] = events.PoolSlots{Labels: poolLabels[pool], Slots: n}
	}
	return o
}

type model struct {
	t        *rapid.T
	now      time.Time
	hist     []events.Event
	jobs     []*mJob
	attempts []*mAttempt
	hosts    []*mHost
	alarms   map[string]bool
	leaks    bool // VMs may stop under running jobs (genLeakyHistory)
}

// tick advances the clock by 0–2 s (at least minStep), so times are
// non-decreasing and sometimes equal.
func (m *model) tick(minStep int) time.Time {
	m.now = m.now.Add(time.Duration(rapid.IntRange(minStep, 2).Draw(m.t, "dt")) * time.Second)
	return m.now
}

// emit appends a fact with the next sequence at the current clock.
func (m *model) emit(p events.Payload) {
	e := events.New("model", m.now, p)
	e.Seq = uint64(len(m.hist) + 1)
	m.hist = append(m.hist, e)
}

// next is emit after a tick of 0–2 s.
func (m *model) next(p events.Payload) { m.tick(0); m.emit(p) }

// nextBy is next for a fact written by role (its subject names it).
func (m *model) nextBy(role events.Role, p events.Payload) {
	m.tick(0)
	e := events.NewBy("model", role, m.now, p)
	e.Seq = uint64(len(m.hist) + 1)
	m.hist = append(m.hist, e)
}

// releaseFact releases a reservation. A completion names the job the runner
// ran, which may not be the one the attempt was booked for (law 8).
func (m *model) releaseFact(a *mAttempt, reason string) {
	a.released = true
	jobID := a.job
	if reason == events.ReleaseCompleted {
		jobID = a.took
	}
	culprit := ""
	if reason == events.ReleaseCreateFailed || reason == events.ReleaseProvisionTimeout {
		culprit = events.CulpritHost // as the deciders charge them: the host's failure streak grows
	}
	m.next(&events.SlotReleased{Pool: a.ref.Pool, Host: a.ref.Host, Attempt: a.ref.Attempt, Reason: reason, JobID: jobID, Culprit: culprit})
}

// actions lists every step the model may take next: the common ones that
// move the lifecycle forward, the rare ones (cancellations, failures,
// abandonment) and noise (operator and watchdog facts).
func (m *model) actions() (common, rare, noise []func()) {
	add := func(f func()) { common = append(common, f) }
	addRare := func(f func()) { rare = append(rare, f) }
	addNoise := func(f func()) { noise = append(noise, f) }
	jobByID := map[int64]*mJob{}
	for _, j := range m.jobs {
		jobByID[j.ref.JobID] = j
	}
	for _, j := range m.jobs {
		j := j
		switch j.status {
		case events.StatusUnknown:
			addRare(func() { j.status = events.StatusWaiting; m.next(&events.JobWaiting{JobRef: j.ref}) })
			fallthrough
		case events.StatusWaiting:
			add(func() { j.status = events.StatusQueued; m.next(&events.JobQueued{JobRef: j.ref}) })
			addRare(func() {
				j.status = events.StatusCompleted
				m.next(&events.JobCompleted{JobRef: j.ref, Conclusion: "cancelled"})
			})
		case events.StatusQueued:
			addRare(func() {
				j.status = events.StatusCompleted
				m.next(&events.JobCompleted{JobRef: j.ref, Conclusion: "cancelled"})
			})
			if j.unsched {
				break
			}
			waiting := true
			for _, a := range m.attempts {
				if a.job == j.ref.JobID && a.held() {
					waiting = false
				}
			}
			if waiting && j.attempts >= 2 {
				addRare(func() {
					j.unsched = true
					m.next(&events.JobUnschedulable{JobID: j.ref.JobID, Reason: "too many failures", Attempts: j.attempts})
				})
			}
			if !waiting || j.attempts >= 3 {
				break
			}
			for _, h := range m.hosts {
				h := h
				if m.freeSlot(h, j.pool) {
					add(func() { m.reserve(j, h) })
				}
			}
		case events.StatusInProgress:
			add(func() {
				j.status = events.StatusCompleted
				m.next(&events.JobCompleted{JobRef: j.ref, Conclusion: "success", RunnerName: j.runner})
			})
		}
	}
	for _, a := range m.attempts {
		a := a
		r := a.ref
		switch {
		case a.held() && !a.placed:
			add(func() {
				a.placed = true
				m.next(&events.AttemptPlaced{AttemptRef: r, JobID: a.job, Labels: poolLabels[r.Pool], RunnerID: int64(len(m.hist) + 1)})
			})
			addRare(func() { m.releaseFact(a, events.ReleaseMintFailed) })
		case a.held() && a.placed && !a.prov:
			add(func() { a.prov = true; m.next(&events.AttemptProvisioning{AttemptRef: r}) })
		case a.held() && a.prov && !a.started && !a.failed && !a.aband:
			add(func() { a.started = true; m.next(&events.AttemptRunnerStarted{AttemptRef: r, Took: time.Second}) })
			addRare(func() { a.failed = true; m.next(&events.AttemptFailed{AttemptRef: r, Step: "create", Error: "exit 1"}) })
			addRare(func() { a.aband = true; m.next(&events.AttemptAbandoned{AttemptRef: r, Step: "create"}) })
			addRare(func() { m.releaseFact(a, events.ReleaseProvisionTimeout) })
		case a.held() && (a.failed || a.aband):
			add(func() { m.releaseFact(a, events.ReleaseCreateFailed) })
		case a.held() && a.started && a.took == 0:
			for _, j := range m.jobs {
				j := j
				if j.status == events.StatusQueued && j.pool == r.Pool && j.runner == "" {
					add(func() {
						a.took, j.runner, j.status = j.ref.JobID, r.Attempt, events.StatusInProgress
						m.next(&events.JobInProgress{JobRef: j.ref, RunnerName: r.Attempt})
					})
				}
			}
			if jobByID[a.job].status != events.StatusQueued || jobByID[a.job].runner != "" {
				add(func() { m.releaseFact(a, events.ReleaseSurplus) })
			}
		case a.held() && a.took != 0 && jobByID[a.took].status == events.StatusCompleted:
			add(func() { m.releaseFact(a, events.ReleaseCompleted) })
		case !a.held() && a.placed && !a.teardown && !a.stopped:
			add(func() { a.teardown = true; m.next(&events.AttemptTeardownRequested{AttemptRef: r, Reason: "released"}) })
		case !a.held() && a.teardown && !a.stopped && !a.aband:
			add(func() { a.stopped = true; m.next(&events.AttemptStopped{AttemptRef: r}) })
			addRare(func() { a.aband = true; m.next(&events.AttemptAbandoned{AttemptRef: r, Step: "stop"}) })
		case !a.held() && a.teardown && !a.stopped && a.aband:
			add(func() { a.stopped = true; m.next(&events.AttemptStopped{AttemptRef: r, Late: true}) })
		}
		if a.took != 0 && !a.bound {
			// The dispatcher records the binding on the attempt's subject.
			add(func() { a.bound = true; m.next(&events.AttemptBound{AttemptRef: r, JobID: a.took}) })
		}
		if a.held() && a.took != 0 && jobByID[a.took].status == events.StatusInProgress {
			// Its VM stops under a running job (the completed webhook is
			// late: a slot leak, which breaks the fold's invariants, so
			// only in histories with leaks), or an operator tears it down
			// mid-job. Common, not rare: the states they make (a held
			// slot whose VM stopped, a VM torn down while its job runs,
			// each with its binding recorded) last a few steps, and the
			// live index's property must meet them often.
			if m.leaks && !a.stopped && !a.teardown {
				add(func() { a.stopped = true; m.next(&events.AttemptStopped{AttemptRef: r}) })
			}
			if !a.teardown {
				add(func() {
					a.teardown = true
					m.nextBy(events.RoleCLI, &events.AttemptTeardownRequested{AttemptRef: r, Reason: "operator"})
				})
			}
		}
		if !a.held() && a.placed && a.took == 0 && !a.deregistered {
			// The dispatcher deletes a released runner's unused registration.
			addRare(func() { a.deregistered = true; m.next(&events.AttemptDeregistered{AttemptRef: r}) })
		}
	}
	// Operator and watchdog facts are keyed by their own time (At), which is
	// kept distinct so that the server would not deduplicate them; their
	// envelope times may tie, and then the stream sequence orders them.
	for _, h := range m.hosts {
		h := h
		addNoise(func() {
			h.cordoned = !h.cordoned
			at := m.tick(0).Add(time.Duration(len(m.hist)) * time.Nanosecond)
			hc := events.HostChange{Host: h.name, Reason: "operator", At: at}
			if h.cordoned {
				m.emit(&events.HostCordoned{HostChange: hc})
			} else {
				m.emit(&events.HostUncordoned{HostChange: hc})
			}
		})
		addNoise(func() {
			h.degraded = !h.degraded
			at := m.tick(0).Add(time.Duration(len(m.hist)) * time.Nanosecond)
			hc := events.HostChange{Host: h.name, Reason: "failures", At: at}
			if h.degraded {
				m.emit(&events.HostDegraded{HostChange: hc, Culprit: events.CulpritHost, Failures: 3})
			} else {
				m.emit(&events.HostRecovered{HostChange: hc})
			}
		})
		addNoise(func() {
			at := m.tick(0).Add(time.Duration(len(m.hist)) * time.Nanosecond)
			m.emit(&events.HostDraining{HostChange: events.HostChange{Host: h.name, Reason: "upgrade", At: at}})
		})
		addNoise(func() { m.next(h.online()) })
	}
	for _, pool := range []string{"linux", "macos"} {
		pool := pool
		key := events.AlarmSlotLeak + "/" + pool
		addNoise(func() {
			m.alarms[key] = !m.alarms[key]
			if at := m.tick(0).Add(time.Duration(len(m.hist)) * time.Second); m.alarms[key] {
				m.emit(&events.AlarmRaised{Key: key, Kind: events.AlarmSlotLeak, Pool: pool, Message: "look", At: at})
			} else {
				m.emit(&events.AlarmCleared{Key: key, Pool: pool, At: at})
			}
		})
		addNoise(func() {
			at := m.tick(0).Add(time.Duration(len(m.hist)) * time.Second)
			m.emit(&events.DemandWaiting{Pool: pool, Jobs: 1, Reason: "no slot", At: at})
		})
	}
	return common, rare, noise
}

func (m *model) freeSlot(h *mHost, pool string) bool {
	held, booked := 0, 0
	for _, a := range m.attempts {
		if a.ref.Host != h.name {
			continue
		}
		if a.ref.Pool == pool && a.held() {
			held++
		}
		if a.booked() {
			booked++
		}
	}
	return held < h.slots[pool] && booked < h.physical
}

func (m *model) reserve(j *mJob, h *mHost) {
	j.attempts++
	id := events.AttemptID(j.ref.JobID, j.attempts)
	a := &mAttempt{ref: events.AttemptRef{Attempt: id, Pool: j.pool, Host: h.name}, job: j.ref.JobID}
	m.attempts = append(m.attempts, a)
	m.next(&events.SlotReserved{Pool: j.pool, Host: h.name, Attempt: id, JobID: j.ref.JobID, N: j.attempts,
		Labels: poolLabels[j.pool]})
}

// genHistory draws a valid history.
func genHistory(t *rapid.T) []events.Event { return genModel(t, false) }

// genLeakyHistory is genHistory in which a VM may also stop under its
// running job while its slot is held (a slot leak: the fold's invariants
// do not hold, but its indexes must).
func genLeakyHistory(t *rapid.T) []events.Event { return genModel(t, true) }

func genModel(t *rapid.T, leaks bool) []events.Event {
	m := &model{t: t, now: t0, alarms: map[string]bool{}, leaks: leaks}
	for i, n := 0, rapid.IntRange(1, 3).Draw(t, "hosts"); i < n; i++ {
		h := &mHost{name: fmt.Sprintf("host-%d", i), slots: map[string]int{},
			physical: rapid.IntRange(1, 4).Draw(t, "physical")}
		for _, pool := range []string{"linux", "macos"} {
			if rapid.Bool().Draw(t, "offers "+pool) {
				h.slots[pool] = rapid.IntRange(1, 4).Draw(t, "slots")
			}
		}
		m.hosts = append(m.hosts, h)
		o := h.online()
		m.next(o)
		g := events.GrantClaim(*o) // the operator grants what it runs
		m.emit(&g)
	}
	for i, n := 0, rapid.IntRange(1, 30).Draw(t, "jobs"); i < n; i++ {
		pool := rapid.SampledFrom([]string{"linux", "macos"}).Draw(t, "pool")
		id := int64(100 + i)
		m.jobs = append(m.jobs, &mJob{pool: pool, ref: events.JobRef{Delivery: "", JobID: id, RunID: 1,
			Repo: "acme/app", Labels: []string{"self-hosted", pool}}})
	}
	for steps := rapid.IntRange(0, 300).Draw(t, "steps"); steps > 0; steps-- {
		common, rare, noise := m.actions()
		if len(common) == 0 && rapid.Bool().Draw(t, "stop") {
			break
		}
		var acts []func()
		switch r := rapid.IntRange(0, 15).Draw(t, "kind"); {
		case r == 7 || r == 13:
			acts = noise
		case r == 3 || r == 11:
			acts = rare
		}
		for _, l := range [][]func(){common, rare, noise} {
			if len(acts) == 0 {
				acts = l
			}
		}
		acts[rapid.IntRange(0, len(acts)-1).Draw(t, "action")]()
	}
	return m.hist
}
