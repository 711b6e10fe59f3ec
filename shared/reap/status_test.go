package reap

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/pgstore"
)

func TestFailingSessions(t *testing.T) {
	fail := func(ids ...string) pgstore.ReapRun {
		var r pgstore.ReapRun
		for _, id := range ids {
			r.Failures = append(r.Failures, pgstore.ReapFailure{Kind: "expired", Session: id, Error: "boom " + id})
		}
		return r
	}
	tests := []struct {
		name   string
		recent []pgstore.ReapRun // newest first
		want   []FailingSession
	}{
		{name: "no runs", want: []FailingSession{}},
		{name: "newest run clean: nothing is failing now", recent: []pgstore.ReapRun{fail(), fail("a")}, want: []FailingSession{}},
		{
			name:   "a fails every run, b only in the newest, c healed",
			recent: []pgstore.ReapRun{fail("b", "a", "a"), fail("a"), fail("a", "c"), fail("c")},
			want: []FailingSession{
				{Session: "a", Kind: "expired", RunsInARow: 3, LastError: "boom a"},
				{Session: "b", Kind: "expired", RunsInARow: 1, LastError: "boom b"},
			},
		},
		{
			name:   "failures without a session (inventory) are not sessions",
			recent: []pgstore.ReapRun{{Failures: []pgstore.ReapFailure{{Kind: "inventory", Error: "timeout"}}}},
			want:   []FailingSession{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, failingSessions(tc.recent)); diff != "" {
				t.Fatalf("failingSessions (-want +got):\n%s", diff)
			}
		})
	}
}
