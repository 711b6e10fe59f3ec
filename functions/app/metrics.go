package app

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"labkeep/shared/seating"
)

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
}

var (
	queueLengthDesc = prometheus.NewDesc("labkeep_waitlist_length",
		"Students waiting in line by lab (entries still polled), read from the database at scrape.", []string{"lab"}, nil)
	queueOldestDesc = prometheus.NewDesc("labkeep_waitlist_oldest_wait_seconds",
		"How long the earliest student waiting for the lab has waited, by lab (0: nobody waits), read from the database at scrape.", []string{"lab"}, nil)
	poolDesc = prometheus.NewDesc("labkeep_pool_instances",
		"Warm pool instances by lab and state (target, idle, starting, claimed), read from the database at scrape.", []string{"lab", "state"}, nil)
)

// seatsCollector is the line per lab (labkeep_waitlist_length,
// labkeep_waitlist_oldest_wait_seconds) and every lab's warm pool
// (labkeep_pool_instances) as gauges, read at every scrape, so they are
// the database's truth whichever instance the students poll or maintains
// the pool. A failed read reports none of its gauges rather than stale
// numbers.
type seatsCollector struct{ seats seatsReader }

func (c seatsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- queueLengthDesc
	ch <- queueOldestDesc
	ch <- poolDesc
}

func (c seatsCollector) Collect(ch chan<- prometheus.Metric) {
	if stats, ok := atScrape(c.seats.QueueStats); ok {
		for _, q := range stats {
			ch <- prometheus.MustNewConstMetric(queueLengthDesc, prometheus.GaugeValue, float64(q.Length), q.Lab)
			ch <- prometheus.MustNewConstMetric(queueOldestDesc, prometheus.GaugeValue, q.OldestWait.Seconds(), q.Lab)
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
