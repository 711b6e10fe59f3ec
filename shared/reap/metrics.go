package reap

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the reaper's Prometheus series. A nil *Metrics records
// nothing, so tests and dry tools need not build one.
type Metrics struct {
	runs     *prometheus.CounterVec
	duration prometheus.Histogram
	reaped   *prometheus.CounterVec
	failures *prometheus.CounterVec
	liveSess prometheus.Gauge
	liveVMs  prometheus.Gauge
}

// NewMetrics creates the series and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "labkeep_reap_runs_total", Help: "Reaper runs by trigger and result (ok, busy).",
		}, []string{"trigger", "result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "labkeep_reap_run_duration_seconds", Help: "Duration of reaper runs.",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 45, 60},
		}),
		reaped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "labkeep_reaped_items_total", Help: "Items reaped, by kind (expired, orphan, ghost).",
		}, []string{"kind"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "labkeep_reap_failures_total", Help: "Items a run failed on, by kind.",
		}, []string{"kind"}),
		liveSess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "labkeep_live_sessions", Help: "Live sessions at the start of the last run.",
		}),
		liveVMs: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "labkeep_live_vms", Help: "VirtualMachines in the namespace at the last run's inventory.",
		}),
	}
	reg.MustRegister(m.runs, m.duration, m.reaped, m.failures, m.liveSess, m.liveVMs)
	return m
}

func (m *Metrics) observeBusy(t Trigger) {
	if m == nil {
		return
	}
	m.runs.WithLabelValues(string(t), "busy").Inc()
}

func (m *Metrics) observeRun(r Report, liveSessions, liveVMs int) {
	if m == nil {
		return
	}
	m.runs.WithLabelValues(string(r.Trigger), "ok").Inc()
	m.duration.Observe(r.FinishedAt.Sub(r.StartedAt).Seconds())
	if !r.DryRun {
		for kind, n := range r.Counts {
			m.reaped.WithLabelValues(string(kind)).Add(float64(n))
		}
	}
	for _, f := range r.Failures {
		m.failures.WithLabelValues(string(f.Kind)).Inc()
	}
	m.liveSess.Set(float64(liveSessions))
	if liveVMs >= 0 {
		m.liveVMs.Set(float64(liveVMs))
	}
}
