package events

import (
	"slices"
	"time"
)

// Culprits: who a failure is charged to (law 11: blame the culprit, act on
// the whole view). Only CulpritJob counts against a job's attempts
// (Job.FailedAttempts, and so its give-up as unschedulable); every other
// culprit keeps the job as demand and is made visible where it lives:
//
//	job      the job itself cannot be served: GitHub refused a JIT config
//	         for its repository or labels (404, 422: not an auth or rate
//	         answer). Rare on purpose: a job GitHub cancelled is no fault.
//	host     the host's create step failed or overran its deadline, or an
//	         attempt booked there got no runner up before the provisioning
//	         deadline: the host is marked degraded (HostDegraded).
//	image    the runner started and never took a job (it exits and starts
//	         again: e.g. GitHub refuses runners older than 30 days): the
//	         host that boots the image is marked degraded, culprit image.
//	backend  the backend said the fault is its own (ErrBackend: an EC2
//	         capacity or API answer): the host is marked degraded, culprit
//	         backend.
//	github   GitHub refused the App's own credentials (401, 403 not for
//	         rate), rate-limited it, or never answered in time: calls pause
//	         with a back-off, the job stays demand.
//	nats     an append failed: the round decides it again (law 11); or a
//	         provisioning or registration deadline ran across a fault of
//	         NATS the watchdog saw itself: the job stays demand, no host
//	         is degraded.
//	berth    Berth's own fault: a placement the host could not open (a
//	         sealing key the agent does not trust).
//
// Release reasons imply a culprit when the fact does not name one
// (ReleaseCulprit); a fact written by this build names it (SlotReleased.
// Culprit, AttemptFailed.Culprit).
const (
	CulpritJob     = "job"
	CulpritHost    = "host"
	CulpritImage   = "image"
	CulpritBackend = "backend"
	CulpritGitHub  = "github"
	CulpritNATS    = "nats"
	CulpritBerth   = "berth"
)

// Culprits lists every culprit.
var Culprits = []string{CulpritJob, CulpritHost, CulpritImage, CulpritBackend, CulpritGitHub, CulpritNATS, CulpritBerth}

// ReleaseCulprit is who a release for reason is charged to when its fact
// names no culprit (facts written before culprits existed), or "" when the
// release is no failure at all (a completion, a surplus, a cordon, an
// operator).
func ReleaseCulprit(reason string) string {
	switch reason {
	case ReleaseMintFailed:
		return CulpritJob
	case ReleaseCreateFailed, ReleaseProvisionTimeout:
		return CulpritHost
	case ReleaseRegistration, ReleaseRunnerRefused:
		return CulpritImage
	case ReleaseRateLimited, ReleaseGitHubRefused:
		return CulpritGitHub
	}
	return ""
}

// releaseCulprit is the culprit a release fact charges: its own, or the
// one its reason implies.
func releaseCulprit(reason, culprit string) string {
	if culprit != "" {
		return culprit
	}
	return ReleaseCulprit(reason)
}

// CountsAgainstJob reports whether a release for reason, charged to
// culprit ("" for the reason's own), spends one of the job's attempts: only
// a job's own fault does (law 11).
func CountsAgainstJob(reason, culprit string) bool {
	return releaseCulprit(reason, culprit) == CulpritJob
}

// HostFault reports whether culprit is charged to a host (its machine, its
// image or its backend): such failures mark the host degraded.
func HostFault(culprit string) bool {
	return culprit == CulpritHost || culprit == CulpritImage || culprit == CulpritBackend
}

// FailureMemory is how many of a host's most recent placement failures the
// fold keeps (HostHealth.Failures): enough for any degrade threshold.
const FailureMemory = 16

// Mark is a fact's place in the log, for the host's health record: the
// stream sequence orders (law 10), the time is for windows and back-offs.
type Mark struct {
	At  time.Time `json:"at"`
	Seq uint64    `json:"seq"`
	ID  string    `json:"id"`
}

func markOf(e Event) Mark   { return Mark{e.Time, e.Seq, e.ID} }
func (m Mark) stamp() stamp { return stamp{m.At, m.Seq, m.ID} }

// After reports whether m was stored after o (by sequence, law 10).
func (m Mark) After(o Mark) bool { return m.stamp().after(o.stamp()) }

func maxMark(a, b Mark) Mark {
	if a.After(b) {
		return a
	}
	return b
}

// HostFailure is one placement failure charged to a host, its image or
// its backend.
type HostFailure struct {
	Attempt string `json:"attempt"`
	Culprit string `json:"culprit"`
	Reason  string `json:"reason"`
	At      Mark   `json:"at"`
}

// HostHealth is what the log says about a host's recent placements: its
// last failures charged to it, its last successes, and whether the
// watchdog marked it degraded. Every field is order-insensitive: failures
// are the newest by sequence, successes and the degradation last-writer-wins.
type HostHealth struct {
	Failures []HostFailure `json:"failures,omitempty"`
	// CreateOK is the last create step that returned on the host (a runner
	// started); RunnerOK the last runner there that ran a job to its end.
	CreateOK Mark `json:"create_ok"`
	RunnerOK Mark `json:"runner_ok"`
	// Degraded: the watchdog marked the host (HostDegraded) and no
	// HostRecovered came after; Culprit and Reason say why, Since when.
	Degraded bool   `json:"degraded,omitempty"`
	Culprit  string `json:"culprit,omitempty"`
	Reason   string `json:"reason,omitempty"`
	Since    Mark   `json:"since"`
	// Changed is the degradation fact stored last (degraded or recovered).
	Changed Mark `json:"changed"`
}

// failed records a failure charged to the host, keeping the newest
// FailureMemory by sequence. One attempt fails once: of two releases
// for it (a race the server deduplicates), the one stored first stands,
// whatever order they are folded in.
func (h *HostHealth) failed(x HostFailure) {
	for i, have := range h.Failures {
		if have.Attempt == x.Attempt {
			if have.At.After(x.At) {
				h.Failures[i] = x
			}
			return
		}
	}
	h.Failures = append(h.Failures, x)
	slices.SortFunc(h.Failures, func(a, b HostFailure) int {
		switch {
		case a.At.After(b.At):
			return 1
		case b.At.After(a.At):
			return -1
		}
		return 0
	})
	if n := len(h.Failures); n > FailureMemory {
		h.Failures = slices.Delete(h.Failures, 0, n-FailureMemory)
	}
}

// Streak is the host's failures since its last success, newer than since
// (zero: any age): host and backend failures since the last create that
// returned, image failures since the last runner that ran a job. culprit
// is that of the longer run, and last the newest failure counted.
func (h *HostHealth) Streak(since time.Time) (n int, culprit string, last Mark) {
	var machine, image int
	for _, x := range h.Failures {
		if x.At.At.Before(since) {
			continue
		}
		switch {
		case x.Culprit == CulpritImage && x.At.After(h.RunnerOK):
			image++
		case x.Culprit != CulpritImage && x.At.After(h.CreateOK):
			machine++
		default:
			continue
		}
		last = maxMark(last, x.At)
	}
	if image > machine {
		return image, CulpritImage, last
	}
	culprit = CulpritHost
	berth := 0
	for _, x := range h.Failures {
		if x.Culprit == CulpritBackend && x.At.After(h.CreateOK) {
			culprit = CulpritBackend
		}
		if x.Culprit == CulpritBerth && x.At.After(h.CreateOK) && !x.At.At.Before(since) {
			berth++
		}
	}
	if berth*2 > machine { // most of the run: the agent could not open what was placed
		culprit = CulpritBerth
	}
	return machine, culprit, last
}

// FailedSince counts the failures stored after m (e.g. the probes failed
// since the host was marked degraded), and the newest of them.
func (h *HostHealth) FailedSince(m Mark) (n int, last Mark) {
	for _, x := range h.Failures {
		if x.At.After(m) {
			n++
			last = maxMark(last, x.At)
		}
	}
	return n, last
}

// Proven reports whether a degraded host has since shown the success its
// culprit needs: a create that returned (host, backend), or a runner that
// ran a job (image).
func (h *HostHealth) Proven() bool {
	if !h.Degraded {
		return false
	}
	if h.Culprit == CulpritImage {
		return h.RunnerOK.After(h.Since)
	}
	return h.CreateOK.After(h.Since)
}

// GitHubHealth is what the log says about GitHub's answers: the last
// booking released because GitHub refused the App's own credentials, and
// the last placement (a JIT config GitHub gave). Both last-writer-wins.
type GitHubHealth struct {
	Refused Mark `json:"refused"`
	Placed  Mark `json:"placed"`
}

// Refusing reports whether GitHub's last word was a refusal of the App's
// credentials: no placement came after it.
func (g GitHubHealth) Refusing() bool {
	if g.Refused == (Mark{}) {
		return false
	}
	return g.Refused.After(g.Placed)
}

// AgentCulprit is the culprit an agent's failure fact (AttemptFailed) is
// read as: host, image, backend or berth as written; anything else
// (job, github, nats, "", an unknown word) reads as host. An agent speaks
// only for its own host (law 10): were its word taken for job, one
// compromised or buggy host could spend other repositories' jobs'
// attempts and give them up; for nats or github, fail them forever on
// itself and never be degraded.
func AgentCulprit(culprit string) string {
	switch culprit {
	case CulpritHost, CulpritImage, CulpritBackend, CulpritBerth:
		return culprit
	}
	return CulpritHost
}
