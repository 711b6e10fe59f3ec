package reap

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestFailingSessions(t *testing.T) {
	fail := func(ids ...string) Report {
		var r Report
		for _, id := range ids {
			r.Failures = append(r.Failures, Failure{Kind: "expired", Session: id, Error: "boom " + id})
		}
		return r
	}
	tests := []struct {
		name   string
		recent []Report // newest first
		want   []FailingSession
	}{
		{name: "no runs", want: []FailingSession{}},
		{name: "newest run clean: nothing is failing now", recent: []Report{fail(), fail("a")}, want: []FailingSession{}},
		{
			name:   "a fails every run, b only in the newest, c healed",
			recent: []Report{fail("b", "a", "a"), fail("a"), fail("a", "c"), fail("c")},
			want: []FailingSession{
				{Session: "a", Kind: "expired", RunsInARow: 3, LastError: "boom a"},
				{Session: "b", Kind: "expired", RunsInARow: 1, LastError: "boom b"},
			},
		},
		{
			name:   "failures without a session (inventory) are not sessions",
			recent: []Report{{Failures: []Failure{{Kind: "inventory", Error: "timeout"}}}},
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
