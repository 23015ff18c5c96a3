package vmagent_test

import (
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/vmagent"
)

// running: attempt n is placed, provisioning, and its runner took job n,
// as the dispatcher recorded on the attempt's own subject.
func boundVM(n int, more ...events.Payload) []events.Payload {
	h := append(placed(n), &events.AttemptProvisioning{AttemptRef: at(n)},
		&events.AttemptBound{AttemptRef: at(n), JobID: int64(n)})
	return append(h, more...)
}

// Issue 17, class 3: what runs a job is stopped only by its job's end or
// an operator. Given a history and a round, then these stops.
func TestAVMThatRunsAJobIsStoppedOnlyByItsEndOrAnOperator(t *testing.T) {
	for _, tc := range []struct {
		name    string
		history []events.Payload
		cli     events.Payload // appended as an operator (stored on the cli role)
		force   bool
		stops   int
	}{
		{name: "a create abandoned at its deadline whose runner took a job is adopted, not stopped",
			history: boundVM(1, &events.AttemptAbandoned{AttemptRef: at(1), Step: "create"})},
		{name: "a create that failed whose runner took a job is kept",
			history: boundVM(1, &events.AttemptFailed{AttemptRef: at(1), Step: "create", Error: "exit 1"})},
		{name: "a teardown asked before the binding (create failed) does not stop it",
			history: boundVM(1, &events.AttemptTeardownRequested{AttemptRef: at(1), Reason: events.ReleaseCreateFailed})},
		{name: "a teardown on a deadline does not stop it",
			history: boundVM(1, &events.AttemptTeardownRequested{AttemptRef: at(1), Reason: events.ReleaseRegistration})},
		{name: "the job's completion stops it",
			history: boundVM(1, &events.AttemptTeardownRequested{AttemptRef: at(1), Reason: events.ReleaseCompleted}), stops: 1},
		{name: "the job's maximum duration stops it",
			history: boundVM(1, &events.AttemptTeardownRequested{AttemptRef: at(1), Reason: events.ReleaseMaxDuration}), stops: 1},
		{name: "the job's end, recorded after an earlier teardown, stops it",
			history: boundVM(1, &events.AttemptTeardownRequested{AttemptRef: at(1), Reason: events.ReleaseCreateFailed},
				&events.AttemptBound{AttemptRef: at(1), JobID: 1, Ended: true}), stops: 1},
		{name: "an abandoned create stops once its job ended",
			history: boundVM(1, &events.AttemptAbandoned{AttemptRef: at(1), Step: "create"},
				&events.AttemptTeardownRequested{AttemptRef: at(1), Reason: events.ReleaseCompleted}), stops: 1},
		{name: "an operator's teardown stops it",
			history: boundVM(1), cli: &events.AttemptTeardownRequested{AttemptRef: at(1), Reason: events.ReleaseOperator}, stops: 1},
		{name: "the drain's timeout stops it", history: boundVM(1), force: true, stops: 1},
		{name: "an abandoned create with no job bound is stopped",
			history: append(placed(1), &events.AttemptProvisioning{AttemptRef: at(1)}, &events.AttemptAbandoned{AttemptRef: at(1), Step: "create"}),
			stops:   1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := history(tc.history...)
			if tc.cli != nil {
				e := events.NewBy("test", events.RoleCLI, t0.Add(time.Minute), tc.cli)
				e.Seq = f.LastSeq + 1
				f.Apply(e)
			}
			l := local()
			l.ForceStop = tc.force
			if n := len(events.Calls[vmagent.StopCall](vmagent.Decide(f, l))); n != tc.stops {
				t.Errorf("%d stops, want %d", n, tc.stops)
			}
		})
	}
}

// Issue 17, class 5: a drain counts an abandoned VM, from the fold, until
// its late stop is folded.
func TestADrainCountsAnAbandonedVMUntilItsLateStop(t *testing.T) {
	h := append(placed(1), &events.AttemptProvisioning{AttemptRef: at(1)},
		&events.AttemptTeardownRequested{AttemptRef: at(1), Reason: events.ReleaseCompleted},
		&events.AttemptAbandoned{AttemptRef: at(1), Step: "stop"})
	if n, abandoned := vmagent.Active(history(h...), "h-a", nil); n != 1 || abandoned != 1 {
		t.Fatalf("active %d (abandoned %d), want 1 (1): the abandoned VM may still run", n, abandoned)
	}
	h = append(h, &events.AttemptStopped{AttemptRef: at(1), Late: true})
	if n, abandoned := vmagent.Active(history(h...), "h-a", nil); n != 0 || abandoned != 0 {
		t.Fatalf("active %d (abandoned %d) after the late stop, want 0", n, abandoned)
	}
}
