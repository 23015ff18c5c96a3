package run

import (
	"context"
	"errors"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/vmagent/backend"
	"github.com/prometheus/client_golang/prometheus"
)

// measured is a backend whose create, assign and stop calls are counted
// and timed by outcome on the agent's /metrics
// (events.MetricAgentBackendStepSeconds): the steps an operator suspects
// first when VMs are slow or fail. Everything else passes through: the
// stop's report (StopReport) and, through Unwrap, the optional
// capabilities the agent looks for with backend.As.
type measured struct {
	backend.Backend
	seconds *prometheus.HistogramVec
}

// measure wraps be and registers its histogram in reg.
func measure(be backend.Backend, reg prometheus.Registerer) backend.Backend {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: events.MetricAgentBackendStepSeconds,
		Help:    "Backend calls by step (create, assign, stop) and outcome (ok, failed, deadline, canceled, unsupported), in seconds; _count is the calls.",
		Buckets: []float64{0.1, 0.5, 1, 5, 15, 30, 60, 120, 300, 600}}, []string{"step", "outcome"})
	reg.MustRegister(h)
	return measured{Backend: be, seconds: h}
}

func (m measured) Create(ctx context.Context, vm backend.VM) error {
	return m.observe("create", func() error { return m.Backend.Create(ctx, vm) })
}

func (m measured) Assign(ctx context.Context, vm backend.VM) error {
	return m.observe("assign", func() error { return m.Backend.Assign(ctx, vm) })
}

func (m measured) Stop(ctx context.Context, vm backend.VM) error {
	return m.observe("stop", func() error { return m.Backend.Stop(ctx, vm) })
}

// StopReport is the stop step, measured, saying how the VM ended when the
// wrapped backend can tell (backend.StopReporter; "" otherwise): the
// agent stops through it, so the wrapper must not hide the answer.
func (m measured) StopReport(ctx context.Context, vm backend.VM) (ended string, err error) {
	err = m.observe("stop", func() (err error) {
		ended, err = backend.StopEnded(ctx, m.Backend, vm)
		return err
	})
	return ended, err
}

// Unwrap is the measured backend, for its other capabilities
// (backend.As: RunnerOutput, InMemoryJIT).
func (m measured) Unwrap() backend.Backend { return m.Backend }

func (m measured) observe(step string, call func() error) error {
	start := time.Now()
	err := call()
	m.seconds.WithLabelValues(step, outcome(err)).Observe(time.Since(start).Seconds())
	return err
}

// outcome names how a call ended, for the metric's label.
func outcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, backend.ErrNoAssign):
		return "unsupported"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return "failed"
}
