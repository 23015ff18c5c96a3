package scenario

import (
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/tests/ghsim"
)

// Issue 17 (class 5), a registration whose mint answer was lost: given a
// first attempt whose JIT-config call GitHub carried out (the runner is
// registered, offline) but whose answer never reached the dispatcher, when
// its booking runs out and the job is served by a second attempt, then the
// runner sweep deletes attempt 1's stranded registration once it has been
// stranded for the grace, and never the second attempt's live runner: it
// takes the job and completes it while the sweep keeps passing.
func TestARegistrationWhoseMintAnswerWasLostIsSweptAndALiveRunnerIsNot(t *testing.T) {
	w := start(t, func(c *config.Config) {
		c.Dispatcher.RunnerSweepEvery = 500 * time.Millisecond
		c.Dispatcher.RunnerSweepGrace = 2 * time.Second
	})
	sim := w.f.Sim
	j := w.enqueue(linuxLabels, 200*time.Millisecond) // a first job: the sweep now knows the org
	w.await("a first job is served as usual", 20*time.Second, w.jobIs(j, ghsim.StatusCompleted))

	j = w.enqueue(linuxLabels, 6*time.Second) // runs for three times the grace
	a1, a2 := events.AttemptID(j, 1), events.AttemptID(j, 2)
	sim.LoseJITAnswers(func(name string) bool { return name == a1 })
	registered := func(name string) func() bool {
		return func() bool {
			for _, r := range sim.Runners() {
				if r.Name == name {
					return true
				}
			}
			return false
		}
	}
	w.await("attempt 1's runner is registered on GitHub, its answer lost", 10*time.Second, registered(a1))
	w.await("the job runs on attempt 2", 20*time.Second, func() bool {
		v := w.job(j)
		return v.Status == ghsim.StatusInProgress && v.RunnerName == a2
	})
	w.await("attempt 1's stranded registration is deleted", 10*time.Second, func() bool { return !registered(a1)() })
	testkit.Consistently(t, 2*time.Second, "attempt 2's runner stays registered while it runs the job", func() bool {
		return registered(a2)() || w.job(j).Status == ghsim.StatusCompleted // GitHub removes an ephemeral runner after its job
	})
	w.await("the job completes on attempt 2", 20*time.Second, w.jobIs(j, ghsim.StatusCompleted))
	if v := w.job(j); v.RunnerName != a2 || v.Conclusion != ghsim.ConclusionSuccess {
		t.Fatalf("job %+v, want it completed on %s", v, a2)
	}
	if sim.APICalls()[ghsim.RouteListRunnersOrg] == 0 {
		t.Error("the sweep never listed the org's runners")
	}
	w.checkLedger()
}
