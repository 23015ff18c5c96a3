package dispatch

import (
	"errors"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the dispatcher's Prometheus series.
type Metrics struct {
	webhooks     *prometheus.CounterVec
	skippedTotal *prometheus.CounterVec
	held         *prometheus.GaugeVec
	capacity     *prometheus.GaugeVec
	demand       *prometheus.GaugeVec
	mintSeconds  prometheus.Histogram
	apiRemaining prometheus.Gauge
	apiBlocked   prometheus.Gauge
	conflicts    prometheus.Counter
	swept        prometheus.Counter
	// queueSeconds: queued → a runner took the job; onlineSeconds: queued →
	// the runner booked for it started. Both per pool.
	queueSeconds, onlineSeconds *prometheus.HistogramVec
	warm                        *prometheus.GaugeVec
	warmTarget, refillLag       *prometheus.GaugeVec
	belowSince                  map[string]time.Time // pool → since when it has had fewer idle warm VMs than its target
}

// latencyBuckets span a warm hit (under a second) to a long wait for a
// slot (an hour), in seconds.
var latencyBuckets = []float64{0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600}

// NewMetrics registers the dispatcher's series on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		webhooks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: events.MetricWebhooksTotal,
			Help: "Webhook deliveries by event, action and outcome (stored, duplicate, ignored, unauthorized, too_large, bad_request, unavailable)."},
			[]string{"event", "action", "outcome"}),
		skippedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Name: events.MetricEventsSkippedTotal,
			Help: "Events the fold skipped, by reason (unknown_type, malformed)."}, []string{"reason"}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: events.MetricPoolSlotsHeld,
			Help: "Slots held per pool."}, []string{"pool"}),
		capacity: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: events.MetricPoolSlotsCapacity,
			Help: "Slots offered per pool by hosts that are not lost."}, []string{"pool"}),
		demand: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: events.MetricPoolJobsQueued,
			Help: "Queued jobs per pool that no runner has taken yet."}, []string{"pool"}),
		mintSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: events.MetricJITMintSeconds,
			Help: "Time to mint one JIT runner configuration on GitHub.", Buckets: prometheus.DefBuckets}),
	}
	m.apiRemaining = prometheus.NewGauge(prometheus.GaugeOpts{Name: events.MetricGitHubAPIRemaining,
		Help: "GitHub API requests left in the current window, from the last answer's x-ratelimit-remaining."})
	m.apiBlocked = prometheus.NewGauge(prometheus.GaugeOpts{Name: events.MetricGitHubAPIBlockedSeconds,
		Help: "Seconds until GitHub allows calls again (0: not rate limited)."})
	m.conflicts = prometheus.NewCounter(prometheus.CounterOpts{Name: events.MetricJobConflictsTotal,
		Help: "Jobs GitHub reported in progress on a runner already bound to another job (BL-17)."})
	m.swept = prometheus.NewCounter(prometheus.CounterOpts{Name: events.MetricRunnersSweptTotal,
		Help: "Berth-named runner registrations the runner sweep deleted: no live attempt accounted for them (a lost mint answer or placement)."})
	m.queueSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: events.MetricJobQueueSeconds,
		Help: "Time from a job's queued webhook to the in_progress webhook of the runner that took it, per pool.", Buckets: latencyBuckets},
		[]string{"pool"})
	m.onlineSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: events.MetricRunnerOnlineSeconds,
		Help:    "Time from a job's queued webhook to the start of the runner booked for it, per pool, by start: warm (a VM booted before the job) or cold.",
		Buckets: latencyBuckets}, []string{"pool", "start"})
	m.warm = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: events.MetricPoolWarmVMs,
		Help: "Warm VMs per pool by state: warming (booting, no job), idle (booted, waiting for a job), assigned (claimed by a job)."},
		[]string{"pool", "state"})
	m.warmTarget = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: events.MetricPoolWarmTarget,
		Help: "The pool's warm target now (min_idle, or the open schedule window's)."}, []string{"pool"})
	m.refillLag = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: events.MetricPoolWarmRefillLagSeconds,
		Help: "How long the pool has had fewer idle warm VMs than its target (0: at target)."}, []string{"pool"})
	m.belowSince = map[string]time.Time{}
	reg.MustRegister(m.warm, m.warmTarget, m.refillLag)
	reg.MustRegister(m.apiRemaining, m.apiBlocked, m.conflicts, m.swept, m.queueSeconds, m.onlineSeconds)
	for _, reason := range []string{"unknown_type", "malformed", "poison"} {
		m.skippedTotal.WithLabelValues(reason) // exported at 0 from the start, so rates and alerts see it
	}
	reg.MustRegister(m.webhooks, m.skippedTotal, m.held, m.capacity, m.demand, m.mintSeconds)
	return m
}

func (m *Metrics) skipped(err error) {
	reason := "malformed"
	switch {
	case errors.Is(err, events.ErrUnknownType):
		reason = "unknown_type"
	case errors.Is(err, eventlog.ErrPoison):
		reason = "poison"
	case errors.Is(err, events.ErrForged):
		reason = "refused"
	}
	m.skippedTotal.WithLabelValues(reason).Inc()
}

func (m *Metrics) observeBudget(b *Budget, now time.Time) {
	if b == nil {
		return
	}
	remaining, _, _, until, seen := b.State()
	if !seen.IsZero() {
		m.apiRemaining.Set(float64(remaining))
	}
	blocked := 0.0
	if until.After(now) {
		blocked = until.Sub(now).Seconds()
	}
	m.apiBlocked.Set(blocked)
}

// observe sets the gauges from the fold; warm gives each pool's warm target
// at now, for the target and refill-lag gauges.
func (m *Metrics) observe(f *events.Fleet, warm map[string]WarmPool, now time.Time) {
	st := f.StatusCounts()
	for _, p := range st.Pools {
		if w, ok := warm[p.Name]; ok {
			target := w.Target(now)
			m.warmTarget.WithLabelValues(p.Name).Set(float64(target))
			lag := 0.0
			switch since, below := m.belowSince[p.Name]; {
			case p.WarmIdle >= target:
				delete(m.belowSince, p.Name)
			case !below:
				m.belowSince[p.Name] = now
			default:
				lag = now.Sub(since).Seconds()
			}
			m.refillLag.WithLabelValues(p.Name).Set(lag)
		}
		m.held.WithLabelValues(p.Name).Set(float64(p.Held))
		m.capacity.WithLabelValues(p.Name).Set(float64(p.Capacity))
		m.demand.WithLabelValues(p.Name).Set(float64(p.PendingDemand))
		m.warm.WithLabelValues(p.Name, "warming").Set(float64(p.WarmWarming))
		m.warm.WithLabelValues(p.Name, "idle").Set(float64(p.WarmIdle))
		m.warm.WithLabelValues(p.Name, "assigned").Set(float64(p.WarmAssigned))
	}
}
