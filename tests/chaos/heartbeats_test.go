package chaos

import (
	"context"
	"testing"
	"time"

	"fmt"
	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/tests/ghsim"
	"github.com/berth-ci/berth/tests/procs"
)

// Given a 3-node NATS cluster and jobs running, when the node that leads
// the agents' heartbeat bucket dies and stays down longer than host_ttl,
// then no host is declared lost: the heartbeats live in a bucket replicated
// like the log (nats.replicas), so one node's loss, which the cluster is
// there to survive, is not read as every host going silent (law 7: a
// missing read is not a fact). With the bucket on one replica, the watchdog
// declared both hosts lost, released the running jobs' slots and had their
// VMs stopped mid-job: those jobs were never completed.
func TestLosingANATSNodeLosesNoHost(t *testing.T) {
	t.Parallel() // mostly waiting: it shares the machine with the other tests here
	outage(t, 15*time.Second, func(sys *procs.System) []*procs.Proc {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := sys.JetStream().Stream(ctx, "KV_berth_heartbeats")
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil || info.Cluster == nil {
			t.Fatalf("heartbeat bucket info: %v %+v", err, info)
		}
		t.Logf("heartbeat bucket: %d replicas, leader %s", info.Config.Replicas, info.Cluster.Leader)
		return []*procs.Proc{sys.Proc(info.Cluster.Leader)}
	})
}

// Given a 3-node NATS cluster and jobs running, when two nodes die and the
// log and the heartbeat bucket are unavailable for longer than host_ttl,
// then no host is declared lost once the cluster is back: while the bucket
// does not answer, the agents' heartbeats can be neither stored nor read, so
// the watchdog counts a host's silence only from when it can hear again (law
// 7). Without that, the watchdog declared every host lost the moment the log
// took appends again, released the running jobs' slots and had their VMs
// stopped mid-job: those jobs were never completed.
func TestLosingNATSQuorumLosesNoHost(t *testing.T) {
	t.Parallel()
	outage(t, 10*time.Second, func(sys *procs.System) []*procs.Proc {
		return sys.NATS.Nodes[1:]
	})
}

// outage runs four long jobs, kills the nodes pick chooses for longer than
// host_ttl, restarts them, and checks that every job was served once and no
// host was declared lost.
func outage(t *testing.T, hostTTL time.Duration, pick func(*procs.System) []*procs.Proc) {
	sys := procs.Start(t, procs.Options{NATSNodes: 3, Tune: func(c *config.Config) {
		c.Watchdog.HostTTL = hostTTL
		c.Watchdog.RegistrationTimeout = time.Minute
		c.Watchdog.ProvisionTimeout = 30 * time.Second
	}})
	var ids []int64
	for range 4 {
		ids = append(ids, sys.Sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted", "linux"}, Duration: hostTTL + 20*time.Second}))
	}
	testkit.EventuallyErr(t, 30*time.Second, fmt.Sprintf("%d jobs running", len(ids)), func() error {
		running := 0
		for _, j := range sys.Sim.Jobs() {
			if j.Status == ghsim.StatusInProgress {
				running++
			}
		}
		if running < len(ids) {
			return fmt.Errorf("only %d running", running)
		}
		return nil
	})
	nodes := pick(sys)
	down := hostTTL + 5*time.Second
	for _, n := range nodes {
		t.Logf("killing %s for %s (host_ttl %s)", n.Name, down, hostTTL)
		n.Kill(t)
	}
	time.Sleep(down) // the nodes stay down past host_ttl: the outage under test
	for _, n := range nodes {
		n.Restart(t)
	}

	sys.AwaitQuiet(60*time.Second, func() {
		_, _, line := sys.Progress()
		t.Log(line)
	})
	sys.Verify()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fleet, err := sys.Replay(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range fleet.Attempts {
		if a.ReleaseReason == events.ReleaseHostLost {
			t.Errorf("attempt %s on %s released because its host was declared lost", a.ID, a.Host)
		}
	}
}
