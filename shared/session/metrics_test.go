package session

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
)

// series flattens what reg gathers into "name{k=v,…}" → value (a
// histogram's sample count), for the labkeep_session* families only.
func series(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "labkeep_session") {
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

// liveRows is memStore with ListLive answering from its rows.
type liveRows struct{ *memStore }

func (l liveRows) ListLive(context.Context) ([]Session, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Session
	for _, s := range l.rows {
		if s.Status.Live() {
			out = append(out, s)
		}
	}
	return out, nil
}

// A student's open, extensions and close, a refused open and a failed one
// each move their series; labkeep_sessions is read from the store.
func TestMetricsCountWhatTheServiceDoes(t *testing.T) {
	now := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	c := &fakeCluster{ready: true}
	svc, store := newService(t, c, &now)
	reg := prometheus.NewRegistry()
	svc.Metrics = NewMetrics(reg, liveRows{store})
	ctx := context.Background()

	s, err := svc.Open(ctx, "ann", "one", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Open(ctx, "bob", "no-such-lab", ""); !errors.Is(err, ErrUnknownLab) {
		t.Fatalf("open of an unknown lab = %v", err)
	}
	if _, err := svc.Open(ctx, "ann", "three", ""); !errors.Is(err, ErrSessionExists) {
		t.Fatalf("second open = %v", err)
	}
	if _, err := svc.Open(ctx, "cid", "shell", ""); err != nil {
		t.Fatal(err)
	}
	if got := series(t, reg)["labkeep_sessions{lab=shell,status=provisioning}"]; got != 1 {
		t.Errorf("live provisioning shell sessions = %v, want 1", got)
	}
	now = now.Add(40 * time.Second)
	if _, err := svc.Extend(ctx, "ann", s.ID); err != nil { // Extend observes the VM ready first
		t.Fatal(err)
	}
	if _, err := svc.Extend(ctx, "ann", "other-id"); !errors.Is(err, ErrNoSession) {
		t.Fatalf("extend of a foreign id = %v", err)
	}
	c.provisionErr = errors.New("admission denied")
	if _, err := svc.Open(ctx, "dee", "one", ""); !errors.Is(err, ErrProvisioning) {
		t.Fatalf("failing open = %v", err)
	}
	c.provisionErr = nil
	if _, err := svc.Close(ctx, "ann", s.ID, ActorStudent, "ann"); err != nil {
		t.Fatal(err)
	}

	// An unclaimed warm-pool instance is live but nobody's session yet.
	store.mu.Lock()
	store.rows["pool-1"] = Session{ID: "pool-1", Student: "labkeep:pool", Lab: "shell", Status: StatusRunning, Pool: PoolIdle}
	store.mu.Unlock()

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
	if diff := cmp.Diff(want, series(t, reg)); diff != "" {
		t.Errorf("series (-want +got):\n%s", diff)
	}
}
