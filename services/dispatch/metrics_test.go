package dispatch_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/dispatch"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The dispatcher's series follow Prometheus naming conventions.
func TestDispatcherMetricsAreLintClean(t *testing.T) {
	reg := prometheus.NewRegistry()
	dispatch.NewMetrics(reg)
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint %s: %s", p.Metric, p.Text)
	}
}

// Given a dispatcher started at t0, when a job queued after t0 gets its
// runner started 3 s later and taken 5 s after it was queued, then the pool's
// time-to-runner-online histogram holds 3 s and its queue-time histogram
// 5 s, once each; facts older than the start (a restart's replay) and a
// repeated fact are not observed; and the series stay lint-clean.
func TestQueueAndRunnerOnlineLatenciesPerPool(t *testing.T) {
	in := newIntake(t)
	reg := prometheus.NewRegistry()
	t0 := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	d, err := dispatch.New(&eventlog.Loop{JS: in.js}, &eventlog.Appender{JS: in.js, Source: "test"}, &countingMinter{},
		dispatch.Options{Now: func() time.Time { return t0 }, Logger: slog.New(slog.DiscardHandler)}, dispatch.NewMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	seq := uint64(0)
	at := func(offset time.Duration, ps ...events.Payload) {
		for _, p := range ps {
			seq++
			e := events.New("test", t0.Add(offset), p)
			e.Seq = seq
			deliver(d, e)
		}
	}
	run := func(job int64, offset time.Duration) {
		r := events.AttemptRef{Attempt: events.AttemptID(job, 1), Pool: "linux", Host: "h-a"}
		at(offset, queued(job))
		at(offset+time.Second, &events.SlotReserved{Pool: "linux", Host: "h-a", Attempt: r.Attempt, JobID: job, N: 1},
			&events.AttemptPlaced{AttemptRef: r, JobID: job, RunnerID: 9})
		at(offset+3*time.Second, &events.AttemptRunnerStarted{AttemptRef: r}, &events.AttemptRunnerStarted{AttemptRef: r})
		at(offset+5*time.Second, &events.JobInProgress{JobRef: ref(job), RunnerName: r.Attempt},
			&events.JobInProgress{JobRef: ref(job), RunnerName: r.Attempt})
	}
	at(-time.Hour, host("h-a", 4, 4))
	run(1, -time.Minute) // before the start: replayed, not observed
	run(2, time.Second)

	got := map[string][2]float64{} // name → count, sum
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			if h := m.GetHistogram(); h != nil && len(m.GetLabel()) >= 1 && m.GetLabel()[0].GetValue() == "linux" {
				got[mf.GetName()] = [2]float64{float64(h.GetSampleCount()), h.GetSampleSum()}
			}
		}
	}
	want := map[string][2]float64{"berth_runner_online_seconds": {1, 3}, "berth_job_queue_seconds": {1, 5}}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s{pool=linux}: count, sum = %v, want %v", name, got[name], w)
		}
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint %s: %s", p.Metric, p.Text)
	}
}
