package app

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"labkeep/shared/labs"
	"labkeep/shared/seating"
)

// lineOnly is a waitlist whose Line answers line (all QueueStats reads).
type lineOnly struct {
	seating.Waitlist
	line []seating.Entry
}

func (l lineOnly) Line(context.Context) ([]seating.Entry, error) { return l.line, nil }

// The waitlist gauges are the line per catalog lab, read at scrape;
// without a warm pool there are no pool gauges.
func TestQueueCollector(t *testing.T) {
	now := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	cat, err := labs.Parse([]byte(`labs:
- {name: one, kind: vm, nodes: [{role: vm}], disk: {containerDisk: img}}
- {name: three, kind: vm, nodes: [{role: control}, {role: worker, count: 2}], disk: {containerDisk: img}}
- {name: shell, kind: pod, image: img, nodes: [{role: workspace}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	u := seating.NewUsher(seating.Config{Labs: cat, Now: func() time.Time { return now },
		Limits: seating.Limits{QueueIdle: seating.DefaultQueueIdle},
		Waitlist: lineOnly{line: []seating.Entry{
			{Lab: "one", EnqueuedAt: now.Add(-10 * time.Minute), PolledAt: now},
			{Lab: "one", EnqueuedAt: now.Add(-time.Minute), PolledAt: now},
		}}})
	reg := prometheus.NewRegistry()
	reg.MustRegister(seatsCollector{u})
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			got[mf.GetName()+"{"+m.GetLabel()[0].GetValue()+"}"] = m.GetGauge().GetValue()
		}
	}
	want := map[string]float64{
		"labkeep_waitlist_length{one}": 2, "labkeep_waitlist_oldest_wait_seconds{one}": 600,
		"labkeep_waitlist_length{three}": 0, "labkeep_waitlist_oldest_wait_seconds{three}": 0,
		"labkeep_waitlist_length{shell}": 0, "labkeep_waitlist_oldest_wait_seconds{shell}": 0,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("gauges (-want +got):\n%s", diff)
	}
}

// Each seating event moves its counter by one, by lab.
func TestSeatingMetricsCount(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newSeatingMetrics(reg)
	m.QueueEvent("one", seating.QueueJoined)
	m.QueueEvent("one", seating.QueueJoined)
	m.PoolClaimed("shell", seating.ClaimEmpty)
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, c := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range c.GetLabel() {
				key += " " + l.GetValue()
			}
			got[key] = c.GetCounter().GetValue()
		}
	}
	want := map[string]float64{"labkeep_waitlist_events_total joined one": 2, "labkeep_pool_claims_total shell empty": 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("counters (-want +got):\n%s", diff)
	}
}
