package guard

import "github.com/prometheus/client_golang/prometheus"

// Metrics are guardian's Prometheus metrics.
type Metrics struct {
	kills            *prometheus.CounterVec
	alerts           *prometheus.CounterVec
	bombs            prometheus.Counter
	memoryUsage      prometheus.Gauge
	memoryLimit      prometheus.Gauge
	memoryReaction   prometheus.Gauge
	bombContainment  prometheus.Gauge
	cpuFraction      prometheus.Gauge
	sshUp            prometheus.Gauge
	sshProbeSeconds  prometheus.Gauge
	protected        prometheus.Gauge
	processes        prometheus.Gauge
	protectionErrors *prometheus.CounterVec
	guarded          prometheus.Gauge
	attaches         prometheus.Counter
}

// NewMetrics creates the metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		kills:            prometheus.NewCounterVec(prometheus.CounterOpts{Name: "guardian_kills_total", Help: "Processes guardian killed, by reason."}, []string{"reason"}),
		alerts:           prometheus.NewCounterVec(prometheus.CounterOpts{Name: "guardian_alerts_total", Help: "Alerts raised, by kind (before aggregation)."}, []string{"kind"}),
		bombs:            prometheus.NewCounter(prometheus.CounterOpts{Name: "guardian_fork_bombs_total", Help: "Fork bombs detected and contained."}),
		memoryUsage:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "guardian_memory_usage_bytes", Help: "Workspace cgroup memory usage."}),
		memoryLimit:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "guardian_memory_limit_bytes", Help: "The workspace memory limit M."}),
		memoryReaction:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "guardian_memory_reaction_seconds", Help: "Last memory emergency: kill threshold crossed to victim dead."}),
		bombContainment:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "guardian_fork_bomb_containment_seconds", Help: "Last fork bomb: detection to contained."}),
		cpuFraction:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "guardian_cpu_fraction", Help: "Workspace CPU use as a fraction of its capacity."}),
		sshUp:            prometheus.NewGauge(prometheus.GaugeOpts{Name: "guardian_ssh_up", Help: "1 when the last SSH probe got a banner."}),
		sshProbeSeconds:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "guardian_ssh_probe_seconds", Help: "Duration of the last SSH probe."}),
		protected:        prometheus.NewGauge(prometheus.GaugeOpts{Name: "guardian_protected_processes", Help: "Processes in the protected set."}),
		processes:        prometheus.NewGauge(prometheus.GaugeOpts{Name: "guardian_workspace_processes", Help: "Processes in the workspace cgroup."}),
		protectionErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "guardian_protection_errors_total", Help: "Failures to apply a protection, by kind."}, []string{"kind"}),
		guarded:          prometheus.NewGauge(prometheus.GaugeOpts{Name: "guardian_workspace_guarded", Help: "1 while a live workspace cgroup is guarded."}),
		attaches:         prometheus.NewCounter(prometheus.CounterOpts{Name: "guardian_workspace_attaches_total", Help: "Workspace cgroups guarded so far (the first, then one per container restart)."}),
	}
	reg.MustRegister(m.kills, m.alerts, m.bombs, m.memoryUsage, m.memoryLimit, m.memoryReaction, m.bombContainment,
		m.cpuFraction, m.sshUp, m.sshProbeSeconds, m.protected, m.processes, m.protectionErrors, m.guarded, m.attaches)
	return m
}
