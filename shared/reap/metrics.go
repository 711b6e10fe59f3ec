package reap

// Metrics counts the reaper's runs; the entry points implement it
// (Prometheus), so reap depends on no metrics library.
type Metrics interface {
	// Busy counts one run of trigger refused because another run held
	// the reaper lock.
	Busy(trigger Trigger)
	// Ran reports a finished run: its report (a dry run's counts are what
	// it would have reaped), the live sessions at its start and the
	// VirtualMachines of its inventory (-1: the run took none).
	Ran(r Report, liveSessions, liveVMs int)
}

type noMetrics struct{}

func (noMetrics) Busy(Trigger)         {}
func (noMetrics) Ran(Report, int, int) {}

// metrics is r.Metrics, or one that counts nothing when it is nil.
func (r *Reaper) metrics() Metrics {
	if r.Metrics == nil {
		return noMetrics{}
	}
	return r.Metrics
}
