package watchdog

import (
	"github.com/berth-ci/berth/events"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the fleet gauges the watchdog derives from its fold: what an
// operator graphs and alerts on (law 6: visible when stuck).
type Metrics struct {
	held, capacity, running, provisioning, waiting, abandonedPool *prometheus.GaugeVec
	alarms                                                        *prometheus.GaugeVec
	liveVMs, abandonedHost, physicalCap, cordoned                 *prometheus.GaugeVec
	skew                                                          *prometheus.GaugeVec
}

// NewMetrics registers the watchdog's series on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	pool := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"pool"})
	}
	host := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"host"})
	}
	m := &Metrics{
		held:          pool(events.MetricPoolSlotsHeld, "Slots held per pool."),
		capacity:      pool(events.MetricPoolSlotsCapacity, "Slots offered per pool by hosts that are not lost."),
		running:       pool(events.MetricPoolAttemptsRunning, "Held slots whose runner started or took a job."),
		provisioning:  pool(events.MetricPoolAttemptsProvisioning, "Held slots whose VM is still being booked, minted or booted."),
		waiting:       pool(events.MetricPoolJobsWaitingForSlot, "Queued jobs no booked runner will serve."),
		abandonedPool: pool(events.MetricPoolAbandonedVMs, "Abandoned VMs per pool: stops that overran and have not returned."),
		alarms:        pool(events.MetricPoolAlarmsActive, "Active alarms per pool (e.g. a suspected slot leak)."),
		liveVMs:       host(events.MetricHostLiveVMs, "VMs that exist on the host, abandoned ones included."),
		abandonedHost: host(events.MetricHostAbandonedVMs, "Abandoned VMs on the host."),
		physicalCap:   host(events.MetricHostPhysicalCap, "How many VMs the host can run at once."),
		cordoned:      host(events.MetricHostCordoned, "1 when the host takes no new placements."),
		skew: host(events.MetricHostClockSkewSeconds,
			"The host agent's clock minus the watchdog's, seen when its heartbeat changes (negative: the agent is behind). Reported, never acted on."),
	}
	reg.MustRegister(m.held, m.capacity, m.running, m.provisioning, m.waiting, m.abandonedPool, m.alarms,
		m.liveVMs, m.abandonedHost, m.physicalCap, m.cordoned, m.skew)
	return m
}

func (m *Metrics) observe(st events.Status) {
	if m == nil {
		return
	}
	for _, p := range st.Pools {
		m.held.WithLabelValues(p.Name).Set(float64(p.Held))
		m.capacity.WithLabelValues(p.Name).Set(float64(p.Capacity))
		m.running.WithLabelValues(p.Name).Set(float64(p.Running))
		m.provisioning.WithLabelValues(p.Name).Set(float64(p.Provisioning))
		m.waiting.WithLabelValues(p.Name).Set(float64(p.WaitingForSlot))
		m.abandonedPool.WithLabelValues(p.Name).Set(float64(p.AbandonedVMs))
		m.alarms.WithLabelValues(p.Name).Set(float64(len(p.Alarms)))
	}
	for _, h := range st.Hosts {
		m.liveVMs.WithLabelValues(h.Name).Set(float64(h.LiveVMs))
		m.abandonedHost.WithLabelValues(h.Name).Set(float64(h.AbandonedVMs))
		m.physicalCap.WithLabelValues(h.Name).Set(float64(h.PhysicalCap))
		c := 0.0
		if h.Cordoned {
			c = 1
		}
		m.cordoned.WithLabelValues(h.Name).Set(c)
	}
}

// Observe sets the gauges from a status view (exported for tests).
func Observe(m *Metrics, st events.Status) { m.observe(st) }

// observeLiveness sets each host's clock skew, for the hosts whose
// heartbeat the watchdog has seen change.
func (m *Metrics) observeLiveness(hosts []HostLiveness) {
	if m == nil {
		return
	}
	for _, h := range hosts {
		if h.ClockSkewSeconds != nil {
			m.skew.WithLabelValues(h.Host).Set(*h.ClockSkewSeconds)
		}
	}
}
