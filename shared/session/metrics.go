package session

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the Service's Prometheus series. A nil *Metrics records
// nothing, so a Service built without them (tests, tools) works unchanged.
//
// Endings counted here are the Service's: closes by a student or an
// administrator and failed opens rolled back. The reaper's endings
// (expired, ghost, orphan) are labkeep_reaped_items_total.
type Metrics struct {
	opens       *prometheus.CounterVec
	timeToReady *prometheus.HistogramVec
	extensions  *prometheus.CounterVec
	ends        *prometheus.CounterVec
}

// results are the sentinel errors an open or extend is counted by: the
// result label is the sentinel's code, so it matches the API's error code.
var results = []error{ErrUnknownLab, ErrSessionExists, ErrNoCapacity, ErrProvisioning, ErrExtensionCap, ErrNotRunning, ErrNoSession}

// result is the label of a call's outcome: ok, a sentinel's code, or
// error for anything else (a bad key, a database fault).
func result(err error) string {
	if err == nil {
		return "ok"
	}
	for _, r := range results {
		if errors.Is(err, r) {
			return r.Error()
		}
	}
	return "error"
}

// liveReadTimeout bounds the store read behind labkeep_sessions at each
// scrape.
const liveReadTimeout = 5 * time.Second

// NewMetrics creates the series and registers them with reg. live, if not
// nil, is read at every scrape for labkeep_sessions (live sessions by lab
// and status), so the gauge is the database's truth, whichever instance
// opened the sessions.
func NewMetrics(reg prometheus.Registerer, live Store) *Metrics {
	m := &Metrics{
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
	for _, k := range []EndKind{EndNoCapacity, EndProvisioningFailed} {
		m.ends.WithLabelValues(string(k), string(ActorOpen))
	}
	if live != nil {
		reg.MustRegister(liveCollector{store: live})
	}
	return m
}

func (m *Metrics) opened(lab string, err error) {
	if m == nil {
		return
	}
	if errors.Is(err, ErrUnknownLab) {
		lab = "" // never a label value a caller chose
	}
	m.opens.WithLabelValues(lab, result(err)).Inc()
}

// ready records a student's time to ready. An unclaimed pool instance
// has no student waiting for it: its readiness is not counted.
func (m *Metrics) ready(s Session) {
	if m == nil || s.ReadyAt.IsZero() || s.Pool == PoolIdle {
		return
	}
	m.timeToReady.WithLabelValues(s.Lab).Observe(s.TimeToReady().Seconds())
}

func (m *Metrics) extended(err error) {
	if m == nil {
		return
	}
	m.extensions.WithLabelValues(result(err)).Inc()
}

func (m *Metrics) ended(r EndReason) {
	if m == nil {
		return
	}
	m.ends.WithLabelValues(string(r.Kind), string(r.Actor)).Inc()
}

var liveDesc = prometheus.NewDesc("labkeep_sessions", "Live students' sessions by lab and status (provisioning, running), read from the database at scrape; unclaimed warm-pool instances are labkeep_pool_instances.", []string{"lab", "status"}, nil)

// liveCollector reads the live sessions at each scrape. A failed read
// reports no labkeep_sessions series rather than stale numbers (alert on
// absent(labkeep_sessions) only together with the functions being up).
type liveCollector struct{ store Store }

func (c liveCollector) Describe(ch chan<- *prometheus.Desc) { ch <- liveDesc }

func (c liveCollector) Collect(ch chan<- prometheus.Metric) {
	live, ok := atScrape(c.store.ListLive)
	if !ok {
		return
	}
	type key struct{ lab, status string }
	counts := map[key]int{}
	for _, s := range live {
		if s.Pool == PoolIdle {
			continue // a pool instance is nobody's session yet: labkeep_pool_instances counts it
		}
		counts[key{s.Lab, string(s.Status)}]++
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(liveDesc, prometheus.GaugeValue, float64(n), k.lab, k.status)
	}
}

// atScrape is read's answer for a collector, bounded by liveReadTimeout;
// false if it failed: the collector then reports nothing, since one
// failed read must not fail the whole scrape.
func atScrape[T any](read func(context.Context) (T, error)) (T, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), liveReadTimeout)
	defer cancel()
	v, err := read(ctx)
	return v, err == nil
}
