package procs

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/natsauth"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/tests/ghsim"
	"github.com/nats-io/nats.go/jetstream"
)

// Finding F8 of issue 16: a host could claim any pools, labels and slots in
// its announcement, and every fold believed it. Given the real services on
// a real nats-server with the generated permissions, when host-a, with its
// own credential, announces a private pool the admin never granted it (and
// more slots and a larger cap than granted), then no fold offers it that
// pool: a job asking for it books nothing, the over-claim is counted on
// /healthz and alarmed as host_overclaim with the admin's command; once
// the admin grants it with `berth trust host`, the job is placed.
func TestAHostIsOfferedOnlyWhatTheAdminGranted(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nats-server and the services as processes")
	}
	t.Parallel()
	sys := Start(t, Options{Auth: true})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var granted events.PoolSlots
	grantedCap := 0
	for _, a := range sys.Config.Agents {
		if a.Host == "host-a" {
			granted, grantedCap = a.AdvertisedPools()["linux"], a.PhysicalCap
		}
	}
	before, err := sys.Replay(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ha := before.Hosts["host-a"]
	if ha == nil || ha.CurveKey == "" || ha.Pools["linux"].Slots != granted.Slots {
		t.Fatalf("host-a before the claim: %+v, want it offered its granted linux pool", ha)
	}
	private := []string{"private", "self-hosted"}
	claim := events.HostOnline{Host: "host-a", Boot: "forged-boot", CurveKey: ha.CurveKey, Backend: ha.Backend,
		PhysicalCap: 64, At: time.Now().UTC(), Pools: map[string]events.PoolSlots{
			"linux":   {Labels: granted.Labels, Slots: granted.Slots + 10},
			"private": {Labels: private, Slots: 8},
		}}
	nc, _ := roleConn(t, sys, natsauth.AgentRole("host-a"))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	body, err := events.Marshal(events.NewBy("berth/vmagent/host-a", events.RoleAgent, claim.At, claim))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, events.SubjectBy(claim, events.RoleAgent), body); err != nil {
		t.Fatalf("host-a publishing its own announcement: %v", err)
	}
	job := sys.Sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted", "private"}, Duration: 100 * time.Millisecond})

	testkit.EventuallyErr(t, 30*time.Second, "the watchdog alarms on host-a's over-claim", func() error {
		f, err := sys.Replay(ctx)
		if err != nil {
			return err
		}
		h := f.Hosts["host-a"]
		if h.Boot != "forged-boot" {
			return fmt.Errorf("the claim is not folded yet")
		}
		if _, ok := h.Pools["private"]; ok || f.Capacity("private") != 0 {
			return fmt.Errorf("host-a is offered the private pool: %+v", h.Pools)
		}
		if h.Pools["linux"].Slots != granted.Slots || h.PhysicalCap != grantedCap {
			return fmt.Errorf("host-a offered %d linux slots, cap %d; want the granted %d, cap %d", h.Pools["linux"].Slots, h.PhysicalCap, granted.Slots, grantedCap)
		}
		for _, a := range f.Status().Alarms {
			if a.Kind == events.AlarmHostOverclaim && strings.Contains(a.Message, "trust host host-a") {
				return nil
			}
		}
		return fmt.Errorf("no host_overclaim alarm naming `berth trust host host-a`: %+v", f.Status().Alarms)
	})
	booked := func() bool {
		f, err := sys.Replay(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(f.Status().Pools, func(p events.PoolStatus) bool { return p.Name == "private" && p.Held > 0 }) ||
			f.Jobs[job] != nil && f.Jobs[job].Minted > 0
	}
	testkit.Consistently(t, 3*time.Second, "nothing booked in the ungranted pool", func() bool { return !booked() })
	for _, u := range sys.DispatcherURLs {
		if n := healthCount(t, u, "host_overclaims"); n == 0 {
			t.Errorf("%s/healthz: host_overclaims 0, want the over-claim counted", u)
		}
	}

	// The admin grants it: the job is placed.
	out, err := exec.CommandContext(ctx, sys.Bins.Berth, "--nats", sys.NATS.URL(), "--nats-nkey", sys.seedFile(natsauth.RoleAdmin),
		"trust", "host", "host-a", "--pool", fmt.Sprintf("linux=%d:%s", granted.Slots, strings.Join(granted.Labels, ",")),
		"--pool", "private=1:self-hosted,private").CombinedOutput()
	if err != nil {
		t.Fatalf("berth trust host: %v\n%s", err, out)
	}
	testkit.Eventually(t, 30*time.Second, "the private job is booked once granted", booked)
}

// healthCount reads one counter from a service's /healthz detail.
func healthCount(t *testing.T, base, key string) uint64 {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h struct {
		Detail map[string]any `json:"detail"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatal(err)
	}
	n, _ := h.Detail[key].(float64)
	return uint64(n)
}
