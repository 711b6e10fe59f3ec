package warmpool

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestPlan(t *testing.T) {
	now := time.Date(2026, 11, 30, 14, 0, 0, 0, time.UTC)
	const ttl = 2 * time.Hour
	// inst is an instance created age ago.
	inst := func(id string, age time.Duration, ready bool) Instance {
		return Instance{ID: id, Lab: "vm", CreatedAt: now.Add(-age), Ready: ready}
	}
	del := func(i Instance, reason string) Deletion { return Deletion{Instance: i, Reason: reason} }
	fresh := func(id string) Instance { return inst(id, 10*time.Minute, true) }
	var (
		a, b, c = fresh("a"), fresh("b"), fresh("c")
		stale   = inst("stale", ttl, true)
		older   = inst("older", ttl+time.Hour, false)
		old     = inst("old", 90*time.Minute, true)
		young   = inst("young", 5*time.Minute, true)
		booting = inst("booting", 2*time.Minute, false)
		stuck   = inst("stuck", 30*time.Minute, false)
	)
	tests := []struct {
		name string
		in   Input
		want Decision
	}{
		{"at target does nothing",
			Input{Target: 2, Instances: []Instance{a, b}, Free: 10},
			Decision{}},
		{"below target creates the difference",
			Input{Target: 5, Instances: []Instance{a}, Free: 10},
			Decision{Create: 4}},
		{"Free caps Create",
			Input{Target: 5, Instances: []Instance{a}, Free: 2},
			Decision{Create: 2}},
		{"no free capacity creates nothing",
			Input{Target: 5, Free: 0},
			Decision{}},
		{"negative Free creates nothing",
			Input{Target: 5, Free: -3},
			Decision{}},
		{"an instance at its TTL is deleted; the replacement waits for free capacity",
			Input{Target: 2, Instances: []Instance{a, stale}, Free: 0},
			Decision{Delete: []Deletion{del(stale, ReasonTTL)}}},
		{"TTL replace: deleted and a new one created when capacity is free",
			Input{Target: 2, Instances: []Instance{stale, a}, Free: 1},
			Decision{Create: 1, Delete: []Deletion{del(stale, ReasonTTL)}}},
		{"TTL delete is not replaced when the lab no longer wants it",
			Input{Target: 1, Instances: []Instance{a, stale}, Free: 5},
			Decision{Delete: []Deletion{del(stale, ReasonTTL)}}},
		{"zero TTL never expires",
			Input{Target: 1, Instances: []Instance{older}, TTL: -1, Free: 5},
			Decision{}},
		{"above target deletes the surplus: not ready first, newest of them first, then ready oldest first",
			Input{Target: 2, Instances: []Instance{young, stuck, old, booting, a}, Free: 5},
			Decision{Delete: []Deletion{del(booting, ReasonOverTarget), del(stuck, ReasonOverTarget), del(old, ReasonOverTarget)}}},
		{"target zero deletes them all",
			Input{Target: 0, Instances: []Instance{b, a}},
			Decision{Delete: []Deletion{del(a, ReasonOverTarget), del(b, ReasonOverTarget)}}},
		{"students waiting: the pool shrinks to nothing, and nothing is created",
			Input{Target: 3, Instances: []Instance{a, booting}, Waiting: 1, Free: 4},
			Decision{Delete: []Deletion{del(booting, ReasonStudentsWaiting), del(a, ReasonStudentsWaiting)}}},
		{"students waiting with an empty pool: nothing is created whatever is free",
			Input{Target: 3, Waiting: 2, Free: 10},
			Decision{}},
		{"students waiting: an expired instance still says ttl",
			Input{Target: 3, Instances: []Instance{stale, c}, Waiting: 1, Free: 4},
			Decision{Delete: []Deletion{del(stale, ReasonTTL), del(c, ReasonStudentsWaiting)}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.Now = now
			if tc.in.TTL == 0 {
				tc.in.TTL = ttl
			}
			if diff := cmp.Diff(tc.want, Plan(tc.in)); diff != "" {
				t.Errorf("Plan (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPlanKeepsItsInput: Plan sorts a copy, never the caller's slice.
func TestPlanKeepsItsInput(t *testing.T) {
	now := time.Date(2026, 11, 30, 14, 0, 0, 0, time.UTC)
	in := []Instance{
		{ID: "x", CreatedAt: now.Add(-time.Minute), Ready: true},
		{ID: "y", CreatedAt: now.Add(-time.Hour), Ready: false},
	}
	want := append([]Instance(nil), in...)
	Plan(Input{Target: 0, Instances: in, TTL: 0, Now: now})
	if diff := cmp.Diff(want, in); diff != "" {
		t.Errorf("Plan changed its input (-want +got):\n%s", diff)
	}
}
