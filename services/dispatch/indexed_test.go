package dispatch_test

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/dispatch"
	"pgregory.net/rapid"
)

// Given a random history (hosts announcing pools under several label sets,
// cordoned, drained and lost; jobs queued with any labels, taken by our
// runners or others', completed, given up on; plans appended in part, as
// when appends are lost; VMs that fail; compactions), after every step the
// dispatcher's plan read from the fold's indexes equals the plan the full
// scan of the backlog made (issue 19: nothing changes in behaviour).
func TestPropertyIndexedDecideEqualsTheFullScan(t *testing.T) {
	labelSets := [][]string{{"self-hosted", "linux"}, {"linux"}, {"self-hosted", "macos"}, {"self-hosted", "linux", "gpu"}, {"LINUX", "Self-Hosted"}, nil}
	rapid.Check(t, func(t *rapid.T) {
		f := events.NewFleet()
		var seq uint64
		now := t0
		add := func(ps ...events.Payload) {
			for _, p := range ps {
				seq++
				now = now.Add(time.Duration(rapid.IntRange(0, 3000).Draw(t, "ms")) * time.Millisecond)
				at := now
				if _, ok := p.(*events.JobQueued); ok {
					// A redelivery or a second hook can carry an earlier time.
					at = now.Add(-time.Duration(rapid.IntRange(0, 60).Draw(t, "earlier s")) * time.Second)
				}
				e := events.New("test", at, p)
				e.Seq = seq
				f.Apply(e)
			}
		}
		p := params
		p.MaxUnminted = rapid.IntRange(0, 3).Draw(t, "max unminted")
		p.ProvisionTimeout = time.Duration(rapid.IntRange(0, 30).Draw(t, "provision timeout s")) * time.Second
		p.RegistrationTimeout = time.Duration(rapid.IntRange(0, 30).Draw(t, "registration timeout s")) * time.Second
		if n := rapid.IntRange(0, 2).Draw(t, "warm linux"); n > 0 {
			p.Warm = map[string]dispatch.WarmPool{"linux": {MinIdle: n}}
		}
		jobs := rapid.IntRange(1, 15).Draw(t, "jobs")
		for i, n := 0, rapid.IntRange(1, 60).Draw(t, "steps"); i < n; i++ {
			p.Now = now
			plan := dispatch.Decide(f, p)
			if want := dispatch.DecideByScan(f, p); !reflect.DeepEqual(plan, want) {
				t.Fatalf("after %d facts the indexed plan differs from the full scan's:\n got %+v\nwant %+v", seq, plan, want)
			}
			id := int64(rapid.IntRange(1, jobs).Draw(t, "job"))
			ref := events.JobRef{JobID: id, RunID: 1, Labels: labelSets[rapid.IntRange(0, len(labelSets)-1).Draw(t, "labels")],
				Delivery: fmt.Sprintf("d-%d", seq+1)}
			host := fmt.Sprintf("h-%d", rapid.IntRange(1, 3).Draw(t, "host"))
			switch rapid.IntRange(-2, 11).Draw(t, "step") {
			case -2, -1, 0, 1, 2:
				add(&events.JobQueued{JobRef: ref})
			case 3:
				// A runner takes a job: one of ours (an attempt's id) or another.
				runner := fmt.Sprintf("other-%d", id)
				for a := range f.LiveAttempts() {
					if rapid.Bool().Draw(t, "this runner") {
						runner = a.ID
						break
					}
				}
				add(&events.JobInProgress{JobRef: ref, RunnerName: runner})
			case 4:
				runner := ""
				if j := f.Jobs[id]; j != nil {
					runner = j.Runner
				}
				add(&events.JobCompleted{JobRef: ref, RunnerName: runner, Conclusion: "success"})
			case 5:
				pools := map[string]events.PoolSlots{}
				for _, name := range []string{"linux", "macos", "gpu"} {
					if rapid.Bool().Draw(t, "offers "+name) {
						pools[name] = events.PoolSlots{Labels: labelSets[rapid.IntRange(0, 3).Draw(t, name+" labels")], Slots: rapid.IntRange(0, 2).Draw(t, "slots")}
					}
				}
				o := events.HostOnline{Host: host, Boot: fmt.Sprintf("boot-%d", seq), PhysicalCap: rapid.IntRange(1, 4).Draw(t, "physical"),
					CurveKey: "X" + host, Backend: "exec", Pools: pools, Assign: rapid.Bool().Draw(t, "assign")}
				add(&o)
				if rapid.IntRange(0, 3).Draw(t, "granted") > 0 { // an operator grants what it claims
					g := events.GrantClaim(o)
					add(&g)
				}
			case 6:
				switch rapid.IntRange(0, 5).Draw(t, "host change") {
				case 0:
					add(&events.HostCordoned{HostChange: events.HostChange{Host: host, Reason: "test"}})
				case 1:
					add(&events.HostUncordoned{HostChange: events.HostChange{Host: host}})
				case 2:
					add(&events.HostDraining{HostChange: events.HostChange{Host: host}})
				case 3:
					add(&events.HostLost{HostChange: events.HostChange{Host: host}})
				case 4:
					add(&events.HostDegraded{HostChange: events.HostChange{Host: host, At: now}, Culprit: events.CulpritHost, Failures: 3})
				case 5:
					add(&events.HostRecovered{HostChange: events.HostChange{Host: host, At: now}})
				}
			case 7, 8:
				// The plan is appended, each fact or not (a lost append).
				for _, st := range plan.Steps() {
					if st.Fact != nil && rapid.IntRange(0, 4).Draw(t, "append") > 0 {
						add(asPayload(st.Fact))
					}
				}
			case 9:
				// The agents move a VM on: placed and started, or failed.
				for a := range f.LiveAttempts() {
					r := events.AttemptRef{Attempt: a.ID, Pool: a.Pool, Host: a.Host}
					switch {
					case a.Held() && !a.Placed:
						add(&events.AttemptPlaced{AttemptRef: r, JobID: a.JobID, Labels: a.Labels, RunnerID: int64(seq + 1)})
					case a.Placed && !a.Provisioning:
						add(&events.AttemptProvisioning{AttemptRef: r})
					case a.Provisioning && !a.RunnerStarted && rapid.Bool().Draw(t, "fails"):
						add(&events.AttemptFailed{AttemptRef: r, Step: "create", Error: "test"})
					case a.Provisioning && !a.RunnerStarted:
						add(&events.AttemptRunnerStarted{AttemptRef: r})
					case a.TeardownReq && !a.Stopped:
						add(&events.AttemptStopped{AttemptRef: r})
					default:
						continue
					}
					break
				}
			case 10:
				add(&events.JobUnschedulable{JobID: id, Reason: "test"})
			case 11:
				f.Compact(now, time.Duration(rapid.IntRange(0, 60).Draw(t, "retention s"))*time.Second)
			}
		}
	})
}

// asPayload is a plan step's fact as the payload pointer the fold takes.
func asPayload(fact events.Payload) events.Payload {
	switch v := fact.(type) {
	case events.SlotReserved:
		return &v
	case events.SlotReleased:
		return &v
	case events.AttemptTeardownRequested:
		return &v
	case events.AttemptBound:
		return &v
	case events.JobUnschedulable:
		return &v
	case events.JobConflict:
		return &v
	case events.AttemptClaimed:
		return &v
	case events.AttemptPlaced:
		return &v
	case events.Payload:
		return v
	}
	panic(fmt.Sprintf("a plan fact of type %T", fact))
}
