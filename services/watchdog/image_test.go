package watchdog_test

import (
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
)

// refusedRunner: a runner that started on hostName and printed GitHub's
// refusal of its version; the dispatcher released its slot, charged to
// the image.
func refusedRunner(n int, hostName, minimum string) []events.Payload {
	r := cref(n, hostName)
	return []events.Payload{
		&events.SlotReserved{Pool: "linux", Host: hostName, Attempt: r.Attempt, JobID: int64(100 + n), N: 1, Labels: linux},
		&events.AttemptRunnerStarted{AttemptRef: r},
		&events.AttemptRunnerVersion{AttemptRef: r, Image: "default/linux", Version: "2.310.0"},
		&events.AttemptRunnerRefused{AttemptRef: r, Image: "default/linux", Version: "2.310.0", Minimum: minimum,
			Message: "An error occured: Runner version v2.310.0 is deprecated and cannot receive messages."},
		&events.SlotReleased{Pool: "linux", Host: hostName, Attempt: r.Attempt, Reason: events.ReleaseRunnerRefused,
			JobID: int64(100 + n), Culprit: events.CulpritImage},
	}
}

// Given one runner of h-a's image refused by GitHub for its version, when
// the watchdog decides, then it raises one alarm for the pool, charged to
// the image, naming the image, the host, the refused version and the
// minimum, and the host itself is not degraded (it serves its other
// images); when a later runner of the image reports another version, the
// alarm clears.
func TestARefusedRunnerRaisesAnImageAlarmNamingTheMinimumVersion(t *testing.T) {
	l := given().at(0, host("h-a")).at(time.Second, refusedRunner(1, "h-a", "2.329.0")...)
	plan := l.decide(10*time.Second, nil)
	if len(plan.Degrade) != 0 {
		t.Errorf("the host was degraded %+v; only its image should be", plan.Degrade)
	}
	if len(plan.Raise) != 1 || plan.Raise[0].Kind != events.AlarmImageDegraded || plan.Raise[0].Key != "image_degraded/linux/h-a" ||
		events.AlarmCulprit(plan.Raise[0].Kind) != events.CulpritImage {
		t.Fatalf("alarms %+v; want one image_degraded alarm for pool linux on h-a, charged to the image", plan.Raise)
	}
	for _, want := range []string{"image default/linux on host h-a", "refused its runner 2.310.0", "is deprecated and cannot receive messages",
		"at least 2.329.0", "rebuild the image"} {
		if !strings.Contains(plan.Raise[0].Message, want) {
			t.Errorf("alarm message lacks %q:\n%s", want, plan.Raise[0].Message)
		}
	}
	l.fold(plan, 10*time.Second)
	if again := l.decide(11*time.Second, nil); len(again.Raise) != 0 {
		t.Errorf("raised again: %+v", again.Raise)
	}

	r := cref(2, "h-a")
	l.at(20*time.Second, &events.SlotReserved{Pool: "linux", Host: "h-a", Attempt: r.Attempt, JobID: 102, N: 1, Labels: linux},
		&events.AttemptRunnerStarted{AttemptRef: r},
		&events.AttemptRunnerVersion{AttemptRef: r, Image: "default/linux", Version: "2.337.0"})
	if plan := l.decide(21*time.Second, nil); len(plan.Clear) != 1 || plan.Clear[0].Key != "image_degraded/linux/h-a" {
		t.Fatalf("cleared %+v; want the image alarm once a runner reports another version", plan.Clear)
	}
}

// A refusal that names no minimum says what GitHub's rule is instead.
func TestAnImageAlarmWithoutAMinimumStatesGitHubsRule(t *testing.T) {
	l := given().at(0, host("h-a")).at(time.Second, refusedRunner(1, "h-a", "")...)
	plan := l.decide(10*time.Second, nil)
	if len(plan.Raise) != 1 || !strings.Contains(plan.Raise[0].Message, "published within the last 30 days") {
		t.Fatalf("alarms %+v; want one stating the 30-day rule", plan.Raise)
	}
}
