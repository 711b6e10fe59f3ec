package app

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"labkeep/shared/labs"
	"labkeep/shared/reap"
	"labkeep/shared/seating"
	"labkeep/shared/session"
)

// Series registers on reg every labkeep_ series Build registers but
// httpapi's (httpapi.NewHTTPMetrics): the domain's counters and the
// gauges read at scrape, these with nothing behind them. It is for checks
// of the names alone (infra/monitoring's alert rules and dashboard), which
// never gather.
func Series(reg prometheus.Registerer) {
	newCatalogMetrics(reg)
	newSessionMetrics(reg)
	newSeatingMetrics(reg)
	newReapMetrics(reg)
	reg.MustRegister(liveCollector{}, seatsCollector{})
}

// catalogMetrics are the lab catalog's Prometheus series (labs.Metrics).
type catalogMetrics struct {
	generation prometheus.Gauge
	labs       prometheus.Gauge
	failures   prometheus.Counter
}

var _ labs.Metrics = (*catalogMetrics)(nil)

func newCatalogMetrics(reg prometheus.Registerer) *catalogMetrics {
	m := &catalogMetrics{
		generation: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "labkeep_lab_catalog_generation", Help: "Lab catalogs put in force since start (1: the one loaded at start).",
		}),
		labs: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "labkeep_lab_catalog_labs", Help: "Labs in the catalog in force.",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "labkeep_lab_catalog_reload_failures_total", Help: "Changed lab catalog files refused (unreadable or invalid); the last good catalog stayed in force.",
		}),
	}
	reg.MustRegister(m.generation, m.labs, m.failures)
	return m
}

func (m *catalogMetrics) Loaded(gen int64, labs int) {
	m.generation.Set(float64(gen))
	m.labs.Set(float64(labs))
}

func (m *catalogMetrics) Refused() { m.failures.Inc() }

// sessionMetrics are the Service's Prometheus series (session.Metrics).
type sessionMetrics struct {
	opens       *prometheus.CounterVec
	timeToReady *prometheus.HistogramVec
	extensions  *prometheus.CounterVec
	ends        *prometheus.CounterVec
}

var _ session.Metrics = (*sessionMetrics)(nil)

func newSessionMetrics(reg prometheus.Registerer) *sessionMetrics {
	m := &sessionMetrics{
		opens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "labkeep_session_opens_total", Help: "openSession calls by lab (empty for an unknown lab) and result (ok or the error code).",
		}, []string{"lab", "result"}),
		timeToReady: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "labkeep_session_time_to_ready_seconds", Help: "From open to every node ready, by lab, as recorded when the session turns running.",
			Buckets: []float64{5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600},
		}, []string{"lab"}),
		extensions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "labkeep_session_extensions_total", Help: "extendSession calls by result (ok or the error code).",
		}, []string{"result"}),
		ends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "labkeep_session_ends_total", Help: "Sessions the functions ended, by reason (closed, expired, no_capacity, provisioning_failed) and actor (student, admin, open); the reaper's are labkeep_reaped_items_total.",
		}, []string{"reason", "actor"}),
	}
	reg.MustRegister(m.opens, m.timeToReady, m.extensions, m.ends)
	// The endings alerts watch exist at 0 from the start: a counter's
	// first increase is only seen against an earlier sample, so a series
	// born at 1 would hide the first refused or failed open.
	for _, k := range []session.EndKind{session.EndNoCapacity, session.EndProvisioningFailed} {
		m.ends.WithLabelValues(string(k), string(session.ActorOpen))
	}
	return m
}

func (m *sessionMetrics) Opened(lab string, o session.Outcome) {
	m.opens.WithLabelValues(lab, string(o)).Inc()
}

func (m *sessionMetrics) Ready(lab string, d time.Duration) {
	m.timeToReady.WithLabelValues(lab).Observe(d.Seconds())
}

func (m *sessionMetrics) Extended(o session.Outcome) {
	m.extensions.WithLabelValues(string(o)).Inc()
}

func (m *sessionMetrics) Ended(kind session.EndKind, actor session.Actor) {
	m.ends.WithLabelValues(string(kind), string(actor)).Inc()
}

// liveCounter is what labkeep_sessions reads at each scrape
// (session.Starter).
type liveCounter interface {
	CountLive(ctx context.Context) ([]session.LiveCount, error)
}

var liveDesc = prometheus.NewDesc("labkeep_sessions", "Live students' sessions by lab and status (provisioning, running), read from the database at scrape; unclaimed warm-pool instances are labkeep_pool_instances.", []string{"lab", "status"}, nil)

// liveCollector is the live students' sessions by lab and status
// (labkeep_sessions), read at every scrape, so the gauge is the
// database's truth whichever instance opened the sessions. A failed read
// reports no labkeep_sessions series rather than stale numbers (alert on
// absent(labkeep_sessions) only together with the functions being up).
type liveCollector struct{ sessions liveCounter }

func (c liveCollector) Describe(ch chan<- *prometheus.Desc) { ch <- liveDesc }

func (c liveCollector) Collect(ch chan<- prometheus.Metric) {
	live, ok := atScrape(c.sessions.CountLive)
	if !ok {
		return
	}
	for _, n := range live {
		ch <- prometheus.MustNewConstMetric(liveDesc, prometheus.GaugeValue, float64(n.N), n.Lab, string(n.Status))
	}
}

// reapMetrics are the reaper's Prometheus series (reap.Metrics).
type reapMetrics struct {
	runs     *prometheus.CounterVec
	duration prometheus.Histogram
	reaped   *prometheus.CounterVec
	failures *prometheus.CounterVec
	liveSess prometheus.Gauge
	liveVMs  prometheus.Gauge
}

var _ reap.Metrics = (*reapMetrics)(nil)

func newReapMetrics(reg prometheus.Registerer) *reapMetrics {
	m := &reapMetrics{
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

func (m *reapMetrics) Busy(t reap.Trigger) {
	m.runs.WithLabelValues(string(t), "busy").Inc()
}

// Ran counts a run; a dry run's items are not reaped, so they are not
// added to labkeep_reaped_items_total.
func (m *reapMetrics) Ran(r reap.Report, liveSessions, liveVMs int) {
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

// seatingMetrics are seating's Prometheus series: the line's events and
// the warm pool's claims (seating.Metrics).
type seatingMetrics struct {
	waitlist   *prometheus.CounterVec
	poolClaims *prometheus.CounterVec
}

func newSeatingMetrics(reg prometheus.Registerer) *seatingMetrics {
	m := &seatingMetrics{
		waitlist: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "labkeep_waitlist_events_total", Help: "Waitlist entries by lab and event: joined, served (became a provisioning session), dropped (nobody polled it, or its lab left the catalog), left (closed while queued).",
		}, []string{"lab", "event"}),
		poolClaims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "labkeep_pool_claims_total", Help: "Opens and waitlist heads that tried the warm pool, by lab and result (ok, empty: no ready instance, failed: the cluster step failed and the open provisioned cold).",
		}, []string{"lab", "result"}),
	}
	reg.MustRegister(m.waitlist, m.poolClaims)
	return m
}

func (m *seatingMetrics) QueueEvent(lab string, ev seating.QueueEvent) {
	m.waitlist.WithLabelValues(lab, string(ev)).Inc()
}

func (m *seatingMetrics) PoolClaimed(lab string, result seating.ClaimResult) {
	m.poolClaims.WithLabelValues(lab, string(result)).Inc()
}

// seatsReader is what the line and pool gauges read at each scrape
// (seating.Usher).
type seatsReader interface {
	QueueStats(ctx context.Context) ([]seating.QueueStat, error)
	Pools(ctx context.Context) ([]seating.PoolStatus, error)
	Reserved(ctx context.Context) ([]seating.ReservedStat, error)
}

var (
	queueLengthDesc = prometheus.NewDesc("labkeep_waitlist_length",
		"Students waiting in line by lab (entries still polled), read from the database at scrape.", []string{"lab"}, nil)
	queueOldestDesc = prometheus.NewDesc("labkeep_waitlist_oldest_wait_seconds",
		"How long the earliest student waiting for the lab has waited, by lab (0: nobody waits), read from the database at scrape.", []string{"lab"}, nil)
	poolDesc = prometheus.NewDesc("labkeep_pool_instances",
		"Warm pool instances by lab and state (target, idle, starting, claimed), read from the database at scrape.", []string{"lab", "state"}, nil)
	reservedDesc = prometheus.NewDesc("labkeep_reserved_seats",
		"Seats of the reservations holding seats now, by course, lab and state (reserved: booked, taken: by members' live sessions, pooled: by the class's warm instances waiting for a member, held: for the course with nothing running), read from the database at scrape.",
		[]string{"course", "lab", "state"}, nil)
)

// seatsCollector is the line per lab (labkeep_waitlist_length,
// labkeep_waitlist_oldest_wait_seconds), every lab's warm pool
// (labkeep_pool_instances) and the reservations holding seats
// (labkeep_reserved_seats) as gauges, read at every scrape, so they are
// the database's truth whichever instance the students poll or maintains
// the pool. A failed read reports none of its gauges rather than stale
// numbers.
type seatsCollector struct{ seats seatsReader }

func (c seatsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- queueLengthDesc
	ch <- queueOldestDesc
	ch <- poolDesc
	ch <- reservedDesc
}

func (c seatsCollector) Collect(ch chan<- prometheus.Metric) {
	if stats, ok := atScrape(c.seats.QueueStats); ok {
		for _, q := range stats {
			ch <- prometheus.MustNewConstMetric(queueLengthDesc, prometheus.GaugeValue, float64(q.Length), q.Lab)
			ch <- prometheus.MustNewConstMetric(queueOldestDesc, prometheus.GaugeValue, q.OldestWait.Seconds(), q.Lab)
		}
	}
	if reserved, ok := atScrape(c.seats.Reserved); ok {
		for _, r := range reserved {
			for state, n := range map[string]int{"reserved": r.Seats, "taken": r.Taken, "pooled": r.Pooled, "held": r.Held} {
				ch <- prometheus.MustNewConstMetric(reservedDesc, prometheus.GaugeValue, float64(n), r.Course, r.Lab, state)
			}
		}
	}
	if pools, ok := atScrape(c.seats.Pools); ok {
		for _, p := range pools {
			for state, n := range map[string]int{"target": p.Target, "idle": p.Idle, "starting": p.Starting, "claimed": p.Claimed} {
				ch <- prometheus.MustNewConstMetric(poolDesc, prometheus.GaugeValue, float64(n), p.Lab, state)
			}
		}
	}
}

// scrapeReadTimeout bounds each database read behind a gauge.
const scrapeReadTimeout = 5 * time.Second

// atScrape is read's answer for a collector, bounded by
// scrapeReadTimeout; false if it failed: the collector then reports
// nothing, since one failed read must not fail the whole scrape.
func atScrape[T any](read func(context.Context) (T, error)) (T, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeReadTimeout)
	defer cancel()
	v, err := read(ctx)
	return v, err == nil
}
