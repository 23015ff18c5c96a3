package vmagent_test

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/services/vmagent"
)

// BenchmarkAgentDecide measures one round of the agent with one attempt to
// act on and a history of stopped attempts in its fold, as the agent keeps
// them for its retention (10 min). A round must cost what the live VMs
// cost, not the history: walking the whole fold, or the live index (which
// keeps attempts whose runner registration may need deleting, and an
// agent's fold never sees a runner bound to its job), was over half the
// CPU of a 20,000-job throughput run.
func BenchmarkAgentDecide(b *testing.B) {
	for _, stopped := range []int{0, 1000, 10000} {
		b.Run("stopped="+strconv.Itoa(stopped), func(b *testing.B) {
			_, js, _ := testkit.NATS(b)
			a, err := vmagent.New(js, &eventlog.Appender{JS: js, Source: "berth/vmagent/host-a"}, testkit.NewBackend(b), vmagent.Options{
				Host: "host-a", DataDir: b.TempDir(), InventoryEvery: time.Hour,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatal(err)
			}
			var seq uint64
			apply := func(p events.Payload) {
				seq++
				e := events.New("bench", time.Now(), p)
				e.Seq = seq // on its own subject, as its author stores it
				a.Apply(eventlog.Delivered{Event: e})
			}
			for i := range stopped {
				r := events.AttemptRef{Attempt: events.AttemptID(int64(i+1), 1), Pool: "linux", Host: "host-a"}
				apply(&events.AttemptPlaced{AttemptRef: r, JobID: int64(i + 1), RunnerID: int64(i + 1)}) // its runner ran the job
				apply(&events.AttemptProvisioning{AttemptRef: r})
				apply(&events.AttemptTeardownRequested{AttemptRef: r, Reason: events.ReleaseCompleted})
				apply(&events.AttemptStopped{AttemptRef: r})
			}
			// The one attempt to act on: its VM runs; nothing to do this round.
			r := events.AttemptRef{Attempt: events.AttemptID(0, 1), Pool: "linux", Host: "host-a"}
			apply(&events.AttemptPlaced{AttemptRef: r})
			apply(&events.AttemptProvisioning{AttemptRef: r})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			a.Decide(ctx)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				a.Decide(ctx)
			}
		})
	}
}
