package events_test

import (
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
)

// Given a host an operator drained (`berth drain`), when an operator
// uncordons it, then it takes placements again: the way back from a
// drain. An agent's own drain (SIGTERM) is not ended by an uncordon (the
// agent is going away; it ends when it announces itself again), and an
// uncordon written before the drain ends nothing (issue 21's dead end).
func TestAnOperatorsUncordonEndsAnOperatorsDrain(t *testing.T) {
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	change := events.HostChange{Host: "h", At: at, By: "ops", Reason: "maintenance"}
	online := &events.HostOnline{Host: "h", Boot: "b", PhysicalCap: 2, CurveKey: "X"}
	for _, tc := range []struct {
		name    string
		drainBy events.Role
		order   []string
		want    events.HostState
	}{
		{"operator drain, then uncordon", events.RoleCLI, []string{"drain", "uncordon"}, events.HostStateOnline},
		{"agent drain (SIGTERM), then an operator's uncordon", events.RoleAgent, []string{"drain", "uncordon"}, events.HostStateDraining},
		{"uncordon before the drain", events.RoleCLI, []string{"uncordon", "drain"}, events.HostStateDraining},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := events.NewFleet()
			seq := uint64(1)
			apply := func(e events.Event) {
				e.Seq = seq
				seq++
				f.Apply(e)
			}
			apply(events.NewBy("agent", events.RoleAgent, at, online))
			for _, step := range tc.order {
				switch step {
				case "drain":
					apply(events.NewBy("x", tc.drainBy, at, &events.HostDraining{HostChange: change}))
				case "uncordon":
					apply(events.NewBy("cli", events.RoleCLI, at, &events.HostUncordoned{HostChange: change}))
				}
			}
			if got := f.Hosts["h"].State; got != tc.want {
				t.Fatalf("host %s, want %s", got, tc.want)
			}
			// Found by a new user: `berth drain --reason` stored the
			// reason, and neither status nor the page showed it.
			want := ""
			if tc.want == events.HostStateDraining {
				want = change.Reason
			}
			if st := f.Status(); len(st.Hosts) != 1 || st.Hosts[0].DrainReason != want {
				t.Errorf("status hosts %+v: want drain reason %q", st.Hosts, want)
			}
		})
	}
}

// Given a cordon stored under the cli's token whose payload claims the
// watchdog set it, when it is folded, then the fold does not say the
// watchdog cordoned the host: only the watchdog's own subject confirms
// that, and the watchdog lifts only what it set (law 10).
func TestACordonIsTheWatchdogsOnlyOnItsSubject(t *testing.T) {
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	claim := events.HostChange{Host: "h", At: at, By: string(events.RoleWatchdog), Reason: "abandoned VMs"}
	for _, tc := range []struct {
		author events.Role
		want   bool
	}{{events.RoleWatchdog, true}, {events.RoleCLI, false}} {
		f := events.NewFleet()
		e := events.NewBy("x", tc.author, at, &events.HostCordoned{HostChange: claim})
		e.Seq = 1
		f.Apply(e)
		if got := f.Hosts["h"].CordonBy == string(events.RoleWatchdog); got != tc.want {
			t.Errorf("cordon stored by %s: watchdog's = %v, want %v", tc.author, got, tc.want)
		}
	}
}
