package reap

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// A home goes once no session has held it for the retention; one a live
// session holds, one used within the retention, another environment's
// and one already being deleted stay; a home no session mentions counts
// from its making; a zero retention keeps every home.
func TestPlanHomes(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	rules := Rules{Env: "dev", HomeRetention: 30 * day}
	home := func(name string, made time.Time) HomeClaim {
		return HomeClaim{Name: name, Env: "dev", Size: "1Gi", CreatedAt: made}
	}
	tests := []struct {
		name      string
		home      HomeClaim
		use       *HomeUse // nil: no session mentions it
		retention time.Duration
		want      bool
	}{
		{"last used longer ago than the retention goes", home("h", now.Add(-90*day)), &HomeUse{LastEnded: now.Add(-31 * day)}, 0, true},
		{"last used exactly the retention ago goes", home("h", now.Add(-90*day)), &HomeUse{LastEnded: now.Add(-30 * day)}, 0, true},
		{"used within the retention stays", home("h", now.Add(-90*day)), &HomeUse{LastEnded: now.Add(-29 * day)}, 0, false},
		{"held by a live session stays", home("h", now.Add(-90*day)), &HomeUse{Live: true, LastEnded: now.Add(-60 * day)}, 0, false},
		{"never used, made longer ago, goes", home("h", now.Add(-31*day)), nil, 0, true},
		{"never used, made lately, stays", home("h", now.Add(-day)), nil, 0, false},
		{"made after its last recorded use counts from its making", home("h", now.Add(-2*day)), &HomeUse{LastEnded: now.Add(-60 * day)}, 0, false},
		{"another environment's stays", HomeClaim{Name: "h", Env: "prod", CreatedAt: now.Add(-90 * day)}, nil, 0, false},
		{"one being deleted is left to go", HomeClaim{Name: "h", Env: "dev", CreatedAt: now.Add(-90 * day), Deleting: true}, nil, 0, false},
		{"a zero retention keeps every home", home("h", now.Add(-900*day)), nil, -1, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := rules
			if tc.retention < 0 {
				r.HomeRetention = 0
			}
			use := map[string]HomeUse{}
			if tc.use != nil {
				use[tc.home.Name] = *tc.use
			}
			items := PlanHomes(now, []HomeClaim{tc.home}, use, r)
			if got := len(items) == 1; got != tc.want {
				t.Fatalf("PlanHomes = %+v; want the home reaped: %v", items, tc.want)
			}
			if tc.want && (items[0].Kind != Home || items[0].HomeClaim != tc.home || items[0].Reason == "") {
				t.Errorf("item %+v", items[0])
			}
		})
	}
}

// Homes come out by name, so runs report them alike.
func TestPlanHomesOrder(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	old := now.Add(-100 * 24 * time.Hour)
	var homes []HomeClaim
	for _, n := range []string{"home-c", "home-a", "home-b"} {
		homes = append(homes, HomeClaim{Name: n, Env: "dev", CreatedAt: old})
	}
	var got []string
	for _, it := range PlanHomes(now, homes, nil, Rules{Env: "dev", HomeRetention: 30 * 24 * time.Hour}) {
		got = append(got, it.HomeClaim.Name)
	}
	if diff := cmp.Diff([]string{"home-a", "home-b", "home-c"}, got); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
}
