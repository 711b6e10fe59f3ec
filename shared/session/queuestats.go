package session

import (
	"context"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// QueueStat is one lab's line as an administrator sees it: how many
// students wait for it and how long the first of them has waited.
type QueueStat struct {
	Lab    string
	Length int
	// OldestWait is how long the earliest of them has waited (since
	// joining, not since their last poll); zero when nobody waits.
	OldestWait time.Duration
}

// QueueStatsOf counts line (any order) per lab at now: one QueueStat for
// every lab of labs (Length 0 if nobody waits for it) and for every other
// lab someone waits for (one that left the catalog), sorted by lab. An
// entry nobody polled since now−idle is not counted: it has lost its
// place, and the next look at the line drops it (the same rule as
// Waitlist.DropIdle).
func QueueStatsOf(labs []string, line []Entry, now time.Time, idle time.Duration) []QueueStat {
	by := map[string]*QueueStat{}
	for _, l := range labs {
		by[l] = &QueueStat{Lab: l}
	}
	before := now.Add(-idle)
	for _, e := range line {
		if e.PolledAt.Before(before) {
			continue
		}
		q := by[e.Lab]
		if q == nil {
			q = &QueueStat{Lab: e.Lab}
			by[e.Lab] = q
		}
		q.Length++
		if w := now.Sub(e.EnqueuedAt); w > q.OldestWait {
			q.OldestWait = w
		}
	}
	out := make([]QueueStat, 0, len(by))
	for _, q := range by {
		out = append(out, *q)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Lab < out[j].Lab })
	return out
}

// QueueStats reads the line and counts it per lab of the catalog
// (QueueStatsOf); it changes nothing. Without a Waitlist every lab has
// an empty line.
func (s *Service) QueueStats(ctx context.Context) ([]QueueStat, error) {
	var line []Entry
	if s.Waitlist != nil {
		var err error
		if line, err = s.Waitlist.Line(ctx); err != nil {
			return nil, err
		}
	}
	return QueueStatsOf(s.Labs.Names(), line, s.now(), s.Limits.QueueIdle), nil
}

// QueueEvent is what happened to a waitlist entry, the event label of
// labkeep_waitlist_events_total.
type QueueEvent string

// The events of an entry: it joins, then is served (turned into a
// provisioning session), dropped (nobody polled it within QueueIdle, or
// its lab left the catalog) or left (closeSession while queued).
const (
	QueueJoined  QueueEvent = "joined"
	QueueServed  QueueEvent = "served"
	QueueDropped QueueEvent = "dropped"
	QueueLeft    QueueEvent = "left"
)

var (
	queueLengthDesc = prometheus.NewDesc("labkeep_waitlist_length",
		"Students waiting in line by lab (entries still polled), read from the database at scrape.", []string{"lab"}, nil)
	queueOldestDesc = prometheus.NewDesc("labkeep_waitlist_oldest_wait_seconds",
		"How long the earliest student waiting for the lab has waited, by lab (0: nobody waits), read from the database at scrape.", []string{"lab"}, nil)
)

// QueueCollector is the Service's line per lab as gauges
// (labkeep_waitlist_length, labkeep_waitlist_oldest_wait_seconds), read
// with QueueStats at every scrape, so they are the database's truth
// whichever instance the students poll. Register it with the registry of
// NewMetrics.
func (s *Service) QueueCollector() prometheus.Collector { return queueCollector{s} }

// queueCollector reads the line at each scrape. A failed read reports no
// waitlist gauges rather than stale numbers.
type queueCollector struct{ svc *Service }

func (c queueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- queueLengthDesc
	ch <- queueOldestDesc
}

func (c queueCollector) Collect(ch chan<- prometheus.Metric) {
	stats, ok := atScrape(c.svc.QueueStats)
	if !ok {
		return
	}
	for _, q := range stats {
		ch <- prometheus.MustNewConstMetric(queueLengthDesc, prometheus.GaugeValue, float64(q.Length), q.Lab)
		ch <- prometheus.MustNewConstMetric(queueOldestDesc, prometheus.GaugeValue, q.OldestWait.Seconds(), q.Lab)
	}
}
