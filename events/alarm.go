package events

import (
	"strconv"
	"time"
)

// Alarm kinds.
const (
	AlarmSlotLeak = "slot_leak" // held slots that no live attempt accounts for
	// AlarmForgedFact: a fact stored where its payload does not stand, or
	// by a role that may not write it (law 10): a credential is misused.
	AlarmForgedFact = "forged_fact"
	// AlarmHostDegraded: a host of the pool is degraded (HostDegraded):
	// its placements keep failing for a cause that is not the jobs'.
	AlarmHostDegraded = "host_degraded"
	// AlarmGitHubRefused: GitHub refused the App's own credentials; calls
	// pause and jobs wait as demand until it answers again.
	AlarmGitHubRefused = "github_refused"
	// AlarmHostOverclaim: a host announced more than the admin granted it
	// (HostGranted): more pools, other labels, more slots or a larger
	// cap. It is offered only what both say; the message gives the
	// admin's command (OverclaimCommand).
	AlarmHostOverclaim = "host_overclaim"
)

// AlarmRaised: the watchdog saw something an operator must look at. Key is
// stable per condition (e.g. "slot_leak/linux/berth-42-1") so re-raising is
// idempotent. Subject berth.evt.alarm.<pool>. Message says what to do next.
// AlarmCulprit is the culprit an alarm of kind charges (law 11): a slot
// leak is Berth's own bookkeeping, a degraded host the host, GitHub's
// refusal GitHub. A forged fact is charged to the credential that wrote it,
// which its message and parking record name (the author's role is the last
// token of its subject): no culprit class fits an intrusion, so "".
func AlarmCulprit(kind string) string {
	switch kind {
	case AlarmSlotLeak:
		return CulpritBerth
	case AlarmHostDegraded, AlarmHostOverclaim:
		return CulpritHost
	case AlarmGitHubRefused:
		return CulpritGitHub
	case AlarmImageDegraded:
		return CulpritImage
	}
	return ""
}

type AlarmRaised struct {
	Key     string    `json:"key"`
	Kind    string    `json:"kind"`
	Pool    string    `json:"pool"`
	Message string    `json:"message"`
	At      time.Time `json:"at"`
}

func (AlarmRaised) EventType() string      { return TypeAlarmRaised }
func (e AlarmRaised) EventSubject() string { return AlarmSubject(e.Pool) }
func (e AlarmRaised) EventID() string {
	return "alarm/" + e.Key + "/raised/" + strconv.FormatInt(e.At.Unix(), 10)
}

// AlarmCleared: the condition behind Key no longer holds.
type AlarmCleared struct {
	Key  string    `json:"key"`
	Pool string    `json:"pool"`
	At   time.Time `json:"at"`
}

func (AlarmCleared) EventType() string      { return TypeAlarmCleared }
func (e AlarmCleared) EventSubject() string { return AlarmSubject(e.Pool) }
func (e AlarmCleared) EventID() string {
	return "alarm/" + e.Key + "/cleared/" + strconv.FormatInt(e.At.Unix(), 10)
}
