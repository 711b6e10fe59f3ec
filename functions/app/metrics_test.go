package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"labkeep/shared/labs"
	"labkeep/shared/reap"
	"labkeep/shared/seating"
	"labkeep/shared/session"
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

// series flattens what reg gathers into "name{k=v,…}" → value (a
// histogram's sample count), for the families whose names start with
// prefix.
func series(t *testing.T, reg *prometheus.Registry, prefix string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), prefix) {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			slices.Sort(labels)
			key := fmt.Sprintf("%s{%s}", mf.GetName(), strings.Join(labels, ","))
			switch {
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				out[key] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// liveCounts answers CountLive with counts, or fails with err.
type liveCounts struct {
	counts []session.LiveCount
	err    error
}

func (l liveCounts) CountLive(context.Context) ([]session.LiveCount, error) { return l.counts, l.err }

// What session reports for a student's open, extensions and close, a
// refused open and a failed one (shared/session's
// TestMetricsCountWhatTheServiceDoes) moves the series alerts and the
// dashboard read; labkeep_sessions is CountLive's answer at scrape.
func TestSessionMetricsSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newSessionMetrics(reg)
	reg.MustRegister(liveCollector{liveCounts{counts: []session.LiveCount{{Lab: "shell", Status: session.StatusProvisioning, N: 1}}}})
	m.Opened("one", session.OutcomeOK)
	m.Opened("", session.OutcomeOf(session.ErrUnknownLab))
	m.Opened("three", session.OutcomeOf(session.ErrSessionExists))
	m.Opened("shell", session.OutcomeOK)
	m.Ready("one", 40*time.Second)
	m.Extended(session.OutcomeOK)
	m.Extended(session.OutcomeOf(session.ErrNoSession))
	m.Ended(session.EndProvisioningFailed, session.ActorOpen)
	m.Opened("one", session.OutcomeOf(session.ErrProvisioning))
	m.Ended(session.EndClosed, session.ActorStudent)

	want := map[string]float64{
		"labkeep_session_opens_total{lab=,result=unknown_lab}":              1,
		"labkeep_session_opens_total{lab=one,result=ok}":                    1,
		"labkeep_session_opens_total{lab=one,result=provisioning_failed}":   1,
		"labkeep_session_opens_total{lab=shell,result=ok}":                  1,
		"labkeep_session_opens_total{lab=three,result=session_exists}":      1,
		"labkeep_session_extensions_total{result=ok}":                       1,
		"labkeep_session_extensions_total{result=no_session}":               1,
		"labkeep_session_time_to_ready_seconds{lab=one}":                    1,
		"labkeep_session_ends_total{actor=open,reason=provisioning_failed}": 1,
		"labkeep_session_ends_total{actor=open,reason=no_capacity}":         0,
		"labkeep_session_ends_total{actor=student,reason=closed}":           1,
		"labkeep_sessions{lab=shell,status=provisioning}":                   1,
	}
	if diff := cmp.Diff(want, series(t, reg, "labkeep_session")); diff != "" {
		t.Errorf("series (-want +got):\n%s", diff)
	}
}

// A failed read reports no labkeep_sessions series rather than stale
// numbers, and fails nothing else of the scrape.
func TestLiveCollectorReportsNothingOnFailedRead(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(liveCollector{liveCounts{err: errors.New("database down")}})
	if got := series(t, reg, "labkeep_sessions"); len(got) != 0 {
		t.Errorf("series after a failed read = %v, want none", got)
	}
}

// The catalog's gauges are the last generation and labs loaded; each
// refusal counts once.
func TestCatalogMetricsSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newCatalogMetrics(reg)
	m.Loaded(1, 3)
	m.Loaded(2, 4)
	m.Refused()
	m.Refused()
	want := map[string]float64{
		"labkeep_lab_catalog_generation{}":            2,
		"labkeep_lab_catalog_labs{}":                  4,
		"labkeep_lab_catalog_reload_failures_total{}": 2,
	}
	if diff := cmp.Diff(want, series(t, reg, "labkeep_lab_catalog")); diff != "" {
		t.Errorf("series (-want +got):\n%s", diff)
	}
}

// A run counts its items reaped (a dry run's are not) and failures, and
// sets the live gauges; a busy run counts as busy only; a run without
// inventory leaves labkeep_live_vms as it was.
func TestReapMetricsSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newReapMetrics(reg)
	start := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	m.Ran(reap.Report{Trigger: reap.TriggerSchedule, StartedAt: start, FinishedAt: start.Add(time.Second),
		Counts:   map[reap.ItemKind]int{reap.Expired: 2, reap.Orphan: 1},
		Failures: []reap.Failure{{Kind: reap.Ghost}}}, 5, 7)
	m.Ran(reap.Report{Trigger: reap.TriggerAdmin, DryRun: true, StartedAt: start, FinishedAt: start,
		Counts: map[reap.ItemKind]int{reap.Expired: 9}}, 4, -1)
	m.Busy(reap.TriggerSchedule)
	want := map[string]float64{
		"labkeep_reap_runs_total{result=ok,trigger=schedule}":   1,
		"labkeep_reap_runs_total{result=ok,trigger=admin}":      1,
		"labkeep_reap_runs_total{result=busy,trigger=schedule}": 1,
		"labkeep_reap_run_duration_seconds{}":                   2,
		"labkeep_reaped_items_total{kind=expired}":              2,
		"labkeep_reaped_items_total{kind=orphan}":               1,
		"labkeep_reap_failures_total{kind=ghost}":               1,
	}
	got := series(t, reg, "labkeep_reap")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("series (-want +got):\n%s", diff)
	}
	live := series(t, reg, "labkeep_live_")
	if diff := cmp.Diff(map[string]float64{"labkeep_live_sessions{}": 4, "labkeep_live_vms{}": 7}, live); diff != "" {
		t.Errorf("live gauges (-want +got):\n%s", diff)
	}
}
