package bench

import (
	"context"
	"crypto/rand"
	"fmt"
	"strconv"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Lifecycle returns the ten facts of one job served end to end, shaped as
// the services write them (a fresh 300-byte sealed JIT config each, like the
// simulator's sealed to a curve key).
func Lifecycle(id int64, host string, labels []string) []events.Payload {
	pool, poolLabels := "linux", LinuxLabels
	if events.MatchPool(labels, map[string][]string{"linux": LinuxLabels, "macos": MacLabels}) == "macos" {
		pool, poolLabels = "macos", MacLabels
	}
	sealed := make([]byte, 300)
	_, _ = rand.Read(sealed)
	ref := events.JobRef{Delivery: fmt.Sprintf("%08x-0000-4000-8000-%012x", id, id), JobID: id, RunID: 7000000 + id, RunAttempt: 1,
		Org: "example-org", Repo: "example-repo", Name: "build (" + strconv.FormatInt(id%97, 10) + ")", Labels: labels}
	att := events.AttemptID(id, 1)
	ar := events.AttemptRef{Attempt: att, Pool: pool, Host: host}
	inProgress, completed := ref, ref
	inProgress.Delivery += "-p"
	completed.Delivery += "-c"
	return []events.Payload{
		&events.JobQueued{JobRef: ref},
		&events.SlotReserved{Pool: pool, Host: host, Attempt: att, JobID: id, N: 1, Labels: poolLabels},
		&events.AttemptPlaced{AttemptRef: ar, JobID: id, Labels: poolLabels, RunnerID: 100 + id, SealedJIT: sealed,
			SealedBy: "XDISPATCHERCURVEKEYXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX", SealedTo: "XAGENTCURVEKEYXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"},
		&events.AttemptProvisioning{AttemptRef: ar},
		&events.AttemptRunnerStarted{AttemptRef: ar, Took: 40 * time.Millisecond},
		&events.JobInProgress{JobRef: inProgress, RunnerName: att, RunnerID: 100 + id},
		&events.JobCompleted{JobRef: completed, Conclusion: "success", RunnerName: att, RunnerID: 100 + id},
		&events.SlotReleased{Pool: pool, Host: host, Attempt: att, Reason: events.ReleaseCompleted, JobID: id},
		&events.AttemptTeardownRequested{AttemptRef: ar, Reason: events.ReleaseCompleted},
		&events.AttemptStopped{AttemptRef: ar},
	}
}

// Synthesize appends hosts online and then jobs whole lifecycles to
// BERTH_EVENTS with async publishes, each stored as the services store a
// fact (eventlog.StoredMsg: the same body, id and headers), and returns
// how many facts it stored.
func Synthesize(ctx context.Context, url string, hosts, jobs int, timeout time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	nc, err := nats.Connect(url, nats.Name("berth-bench-synth"))
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return 0, err
	}
	at := time.Now().Add(-time.Hour)
	n := 0
	pub := func(p events.Payload) error {
		n++
		ev := events.New("berth/bench-synth", at.Add(time.Duration(n)*time.Millisecond), p)
		msg, opts, err := eventlog.StoredMsg(ev)
		if err != nil {
			return err
		}
		_, err = js.PublishMsgAsync(msg, opts...)
		return err
	}
	specs := Workload(jobs, 7, 0.3, 0, 0, true)
	for h := 0; h < hosts; h++ {
		name := "host-" + strconv.Itoa(h)
		online := events.HostOnline{Host: name, Boot: "boot-1", PhysicalCap: 24, CurveKey: "X" + name, Backend: "bench",
			Pools: map[string]events.PoolSlots{"linux": {Labels: LinuxLabels, Slots: 16}, "macos": {Labels: MacLabels, Slots: 8}}}
		granted := events.GrantClaim(online) // as the operator grants the hosts it runs
		if err := pub(&online); err != nil {
			return n, err
		}
		if err := pub(&granted); err != nil {
			return n, err
		}
	}
	for i, s := range specs {
		for _, p := range Lifecycle(int64(i+1), "host-"+strconv.Itoa(i%hosts), s.Labels) {
			if err := pub(p); err != nil {
				return n, fmt.Errorf("synthesize: %w", err)
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
		return n, nil
	case <-ctx.Done():
		return n, fmt.Errorf("synthesize: %d acks missing after %s", js.PublishAsyncPending(), timeout)
	}
}
