package reap

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/session"
)

// pruneCall is one PruneRefused call a run made.
type pruneCall struct {
	Before time.Time
	Limit  int
}

// retentionStore is a database with no live session and no suspect: a run
// on it does nothing but its retention and its record. The embedded Store
// is nil, so a run calling anything else panics the test.
type retentionStore struct {
	Store
	refused    int
	refusedErr error
	calls      []pruneCall
}

func (s *retentionStore) TryLock(context.Context, string) (func(), bool, error) {
	return func() {}, true, nil
}
func (s *retentionStore) ListLive(context.Context) ([]session.Session, error) { return nil, nil }
func (s *retentionStore) Suspects(context.Context) ([]Suspect, error)         { return nil, nil }
func (s *retentionStore) SaveSuspects(context.Context, []Suspect) error       { return nil }
func (s *retentionStore) RecordRun(context.Context, Report) (int64, error)    { return 1, nil }
func (s *retentionStore) PruneRuns(context.Context, time.Time, int) (int, error) {
	return 2, nil
}
func (s *retentionStore) PruneRefused(_ context.Context, before time.Time, limit int) (int, error) {
	s.calls = append(s.calls, pruneCall{before, limit})
	return s.refused, s.refusedErr
}

// emptyCluster is a namespace with nothing in it.
type emptyCluster struct{ Cluster }

func (emptyCluster) Inventory(context.Context) (Inventory, error) { return Inventory{}, nil }

func (emptyCluster) ListHomes(context.Context) ([]HomeClaim, error) { return nil, nil }

// A run deletes the refused opens that finished more than RefusedRetention
// before it started, at most RetentionBatch of them, and counts them in its
// report; a dry run deletes none; a failure to delete them is a retention
// failure that says it was the refused opens, and the run records are
// pruned all the same.
func TestRunPrunesRefusedOpens(t *testing.T) {
	now := time.Date(2025, 3, 4, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		name         string
		dryRun       bool
		refusedErr   error
		wantCalls    []pruneCall
		wantPruned   int
		wantFailures []Failure
	}{
		{name: "deleted and counted", wantCalls: []pruneCall{{now.Add(-3 * time.Hour), 7}}, wantPruned: 5, wantFailures: []Failure{}},
		{name: "a dry run deletes none", dryRun: true, wantFailures: []Failure{}},
		{name: "a failure names the refused opens", refusedErr: errors.New("connection reset"),
			wantCalls:    []pruneCall{{now.Add(-3 * time.Hour), 7}},
			wantFailures: []Failure{{Kind: FailedRetention, Error: "deleting old refused opens: connection reset"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := &retentionStore{refused: 5, refusedErr: tt.refusedErr}
			cfg := DefaultConfig()
			cfg.Env, cfg.DryRun, cfg.RefusedRetention, cfg.RetentionBatch = "prod", tt.dryRun, 3*time.Hour, 7
			r := &Reaper{Store: st, Cluster: emptyCluster{}, Config: cfg, Now: func() time.Time { return now },
				Log: slog.New(slog.DiscardHandler)}
			got, err := r.RunOnce(context.Background(), TriggerSchedule)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.wantCalls, st.calls); diff != "" {
				t.Errorf("PruneRefused calls (-want +got):\n%s", diff)
			}
			if got.PrunedRefused != tt.wantPruned || got.PrunedRuns != 2 {
				t.Errorf("report pruned %d refused opens and %d runs, want %d and 2", got.PrunedRefused, got.PrunedRuns, tt.wantPruned)
			}
			if diff := cmp.Diff(tt.wantFailures, got.Failures); diff != "" {
				t.Errorf("failures (-want +got):\n%s", diff)
			}
		})
	}
}
