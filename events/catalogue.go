package events

// Versioned CloudEvents types. A new incompatible shape gets a new version
// (…v2) next to the old one; readers skip and count versions they do not know.
const (
	TypeJobQueued        = "berth.job.queued.v1"
	TypeJobWaiting       = "berth.job.waiting.v1"
	TypeJobInProgress    = "berth.job.in_progress.v1"
	TypeJobCompleted     = "berth.job.completed.v1"
	TypeJobUnschedulable = "berth.job.unschedulable.v1"
	TypeJobConflict      = "berth.job.conflict.v1"

	TypeSlotReserved = "berth.slot.reserved.v1"
	TypeSlotReleased = "berth.slot.released.v1"

	TypeAttemptPlaced            = "berth.attempt.placed.v1"
	TypeAttemptProvisioning      = "berth.attempt.provisioning.v1"
	TypeAttemptRunnerStarted     = "berth.attempt.runner_started.v1"
	TypeAttemptFailed            = "berth.attempt.failed.v1"
	TypeAttemptTeardownRequested = "berth.attempt.teardown_requested.v1"
	TypeAttemptStopped           = "berth.attempt.stopped.v1"
	TypeAttemptAbandoned         = "berth.attempt.abandoned.v1"
	TypeAttemptDeregistered      = "berth.attempt.runner_deregistered.v1"
	TypeAttemptReady             = "berth.attempt.ready.v1"
	TypeAttemptClaimed           = "berth.attempt.claimed.v1"
	TypeAttemptAssigned          = "berth.attempt.assigned.v1"
	TypeAttemptBound             = "berth.attempt.bound.v1"
	TypeAttemptRunnerBusy        = "berth.attempt.runner_busy.v1"
	TypeAttemptRunnerVersion     = "berth.attempt.runner_version.v1"
	TypeAttemptRunnerRefused     = "berth.attempt.runner_refused.v1"

	TypeHostOnline     = "berth.host.online.v1"
	TypeHostDraining   = "berth.host.draining.v1"
	TypeHostLost       = "berth.host.lost.v1"
	TypeHostCordoned   = "berth.host.cordoned.v1"
	TypeHostUncordoned = "berth.host.uncordoned.v1"
	TypeHostDegraded   = "berth.host.degraded.v1"
	TypeHostRecovered  = "berth.host.recovered.v1"
	TypeHostGranted    = "berth.host.granted.v1"

	TypeDemandWaiting = "berth.demand.waiting.v1"
	TypeAlarmRaised   = "berth.alarm.raised.v1"
	TypeAlarmCleared  = "berth.alarm.cleared.v1"
)

// catalogue maps each known type to a constructor of its payload.
var catalogue = map[string]func() Payload{
	TypeJobQueued:        func() Payload { return &JobQueued{} },
	TypeJobWaiting:       func() Payload { return &JobWaiting{} },
	TypeJobInProgress:    func() Payload { return &JobInProgress{} },
	TypeJobCompleted:     func() Payload { return &JobCompleted{} },
	TypeJobUnschedulable: func() Payload { return &JobUnschedulable{} },
	TypeJobConflict:      func() Payload { return &JobConflict{} },

	TypeSlotReserved: func() Payload { return &SlotReserved{} },
	TypeSlotReleased: func() Payload { return &SlotReleased{} },

	TypeAttemptPlaced:            func() Payload { return &AttemptPlaced{} },
	TypeAttemptProvisioning:      func() Payload { return &AttemptProvisioning{} },
	TypeAttemptRunnerStarted:     func() Payload { return &AttemptRunnerStarted{} },
	TypeAttemptFailed:            func() Payload { return &AttemptFailed{} },
	TypeAttemptTeardownRequested: func() Payload { return &AttemptTeardownRequested{} },
	TypeAttemptStopped:           func() Payload { return &AttemptStopped{} },
	TypeAttemptAbandoned:         func() Payload { return &AttemptAbandoned{} },
	TypeAttemptDeregistered:      func() Payload { return &AttemptDeregistered{} },
	TypeAttemptReady:             func() Payload { return &AttemptReady{} },
	TypeAttemptClaimed:           func() Payload { return &AttemptClaimed{} },
	TypeAttemptAssigned:          func() Payload { return &AttemptAssigned{} },
	TypeAttemptBound:             func() Payload { return &AttemptBound{} },
	TypeAttemptRunnerBusy:        func() Payload { return &AttemptRunnerBusy{} },
	TypeAttemptRunnerVersion:     func() Payload { return &AttemptRunnerVersion{} },
	TypeAttemptRunnerRefused:     func() Payload { return &AttemptRunnerRefused{} },

	TypeHostOnline:     func() Payload { return &HostOnline{} },
	TypeHostDraining:   func() Payload { return &HostDraining{} },
	TypeHostLost:       func() Payload { return &HostLost{} },
	TypeHostCordoned:   func() Payload { return &HostCordoned{} },
	TypeHostUncordoned: func() Payload { return &HostUncordoned{} },
	TypeHostDegraded:   func() Payload { return &HostDegraded{} },
	TypeHostRecovered:  func() Payload { return &HostRecovered{} },
	TypeHostGranted:    func() Payload { return &HostGranted{} },

	TypeDemandWaiting: func() Payload { return &DemandWaiting{} },
	TypeAlarmRaised:   func() Payload { return &AlarmRaised{} },
	TypeAlarmCleared:  func() Payload { return &AlarmCleared{} },
}

// Types lists every known event type with a zero payload, for schema
// generation and documentation.
func Types() map[string]Payload {
	out := make(map[string]Payload, len(catalogue))
	for t, f := range catalogue {
		out[t] = f()
	}
	return out
}
