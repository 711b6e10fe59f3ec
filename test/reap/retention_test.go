package reap_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/localrun/stacktest"
)

// Run records older than the retention are deleted by the reaper itself,
// oldest first and at most RetentionBatch per run, on the real database;
// younger ones, and the run's own record, stay.
func TestOldRunRecordsAreDeletedInBatches(t *testing.T) {
	h := newBackend(t, stacktest.Options{})
	cfg := &h.App.Reaper.Config
	cfg.Retention, cfg.RetentionBatch = 30*24*time.Hour, 3
	now := h.Clock.Now()
	insert := func(age time.Duration, n int) {
		t.Helper()
		for range n {
			if _, err := h.DB.Exec(context.Background(), `INSERT INTO reap_runs (trigger, started_at, finished_at)
				VALUES ('schedule', $1, $1)`, now.Add(-age)); err != nil {
				t.Fatal(err)
			}
		}
	}
	insert(90*24*time.Hour, 2) // long gone
	insert(31*24*time.Hour, 3) // just past the retention
	insert(29*24*time.Hour, 4) // within it
	insert(30*time.Minute, 1)  // recent
	ages := func() map[string]int {
		t.Helper()
		out := map[string]int{}
		for _, b := range []struct {
			name     string
			from, to time.Duration
		}{{"90d", 60 * 24 * time.Hour, 365 * 24 * time.Hour}, {"31d", 30 * 24 * time.Hour, 60 * 24 * time.Hour},
			{"29d", 24 * time.Hour, 30 * 24 * time.Hour}, {"recent", -time.Hour, 24 * time.Hour}} {
			if n := h.Count(`SELECT count(*) FROM reap_runs WHERE started_at <= $1 AND started_at > $2`,
				now.Add(-b.from), now.Add(-b.to)); n > 0 {
				out[b.name] = n
			}
		}
		return out
	}

	for i, want := range []struct {
		pruned int
		left   map[string]int
	}{
		{3, map[string]int{"31d": 2, "29d": 4, "recent": 1}}, // the oldest three: both 90-day ones first
		{2, map[string]int{"29d": 4, "recent": 1}},           // the rest past the retention
		{0, map[string]int{"29d": 4, "recent": 1}},           // nothing more to do
	} {
		r := h.run()
		if r.PrunedRuns != want.pruned || len(r.Failures) != 0 {
			t.Fatalf("run %d pruned %d with failures %v, want %d", i, r.PrunedRuns, r.Failures, want.pruned)
		}
		// The runs themselves are recorded at the clock's now, as recent.
		want.left["recent"] += i + 1
		if diff := cmp.Diff(want.left, ages()); diff != "" {
			t.Fatalf("after run %d, run records by age (-want +got):\n%s", i, diff)
		}
	}
}
