package session_test

import (
	"testing"

	"labkeep/localrun/stacktest"
)

// metric is the value of the series name with labels (a subset of its
// labels; nil: the unlabelled series) in the deployment's registry, the
// one /metrics serves; 0 if there is no such series yet. Counters,
// gauges, and a histogram's sample count.
func metric(t *testing.T, e *stacktest.Deployment, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := e.App.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}
