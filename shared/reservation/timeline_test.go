package reservation

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/labs"
)

func TestTimeline(t *testing.T) {
	caps := map[labs.Kind]int{labs.KindPod: 8}
	hour := func(h int) time.Time { return t0.Add(time.Duration(h) * time.Hour) }
	reserved := func(slots []Slot) []int {
		out := make([]int, len(slots))
		for i, s := range slots {
			out[i] = s.Reserved
		}
		return out
	}
	tests := map[string]struct {
		holds    []Hold
		caps     map[labs.Kind]int
		from, to time.Time
		step     time.Duration
		want     []int // each slot's Reserved, in order
	}{
		"nothing booked: every hour free": {nil, caps, hour(0), hour(3), time.Hour, []int{0, 0, 0}},
		"one class of 5 from the second hour for an hour, held from its lead (10 min into the first hour)": {
			[]Hold{pods(1, "c", 5, hour(1), time.Hour)}, caps, hour(0), hour(3), time.Hour, []int{5, 5, 0}},
		"two classes that never meet: each hour its own": {
			[]Hold{pods(1, "a", 5, hour(0).Add(15*time.Minute), 30*time.Minute), pods(2, "b", 3, hour(2).Add(30*time.Minute), 15*time.Minute)},
			caps, hour(0), hour(3), time.Hour, []int{5, 0, 3}},
		"two that meet within an hour: the busiest moment, not the sum of the hour": {
			[]Hold{pods(1, "a", 5, hour(0).Add(15*time.Minute), 20*time.Minute), pods(2, "b", 3, hour(0).Add(45*time.Minute), 10*time.Minute)},
			caps, hour(0), hour(1), time.Hour, []int{5}},
		"overlapping within an hour: their sum": {
			[]Hold{pods(1, "a", 5, hour(0).Add(15*time.Minute), time.Hour), pods(2, "b", 3, hour(0).Add(30*time.Minute), time.Hour)},
			caps, hour(0), hour(2), time.Hour, []int{8, 8}},
		"a range the step does not divide: the last slot is shorter": {
			[]Hold{pods(1, "c", 2, hour(0), 2*time.Hour)}, caps, hour(0), hour(1).Add(30 * time.Minute), time.Hour, []int{2, 2}},
		"a bucket without capacity is not shown": {
			[]Hold{pods(1, "c", 2, hour(0), time.Hour)}, map[labs.Kind]int{}, hour(0), hour(1), time.Hour, []int{}},
		"no step: nothing":                        {nil, caps, hour(0), hour(1), 0, []int{}},
		"a range ending where it starts: nothing": {nil, caps, hour(1), hour(1), time.Hour, []int{}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := reserved(Timeline(tc.holds, tc.caps, tc.from, tc.to, tc.step, 10*time.Minute))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("reserved per slot (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("each bucket its own row, in kind order, with its capacity and what stays free", func(t *testing.T) {
		vm := pods(2, "net", 2, hour(0), time.Hour)
		vm.Lab, vm.Kind, vm.PerSeat = "net", labs.KindVM, 3
		got := Timeline([]Hold{pods(1, "c", 5, hour(0), time.Hour), vm}, map[labs.Kind]int{labs.KindVM: 8, labs.KindPod: 20}, hour(0), hour(1), time.Hour, 0)
		want := []Slot{
			{Start: hour(0), End: hour(1), Kind: labs.KindPod, Capacity: 20, Reserved: 5},
			{Start: hour(0), End: hour(1), Kind: labs.KindVM, Capacity: 8, Reserved: 6},
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("slots (-want +got):\n%s", diff)
		}
		if got[1].Free() != 2 {
			t.Errorf("free VMs = %d, want 2", got[1].Free())
		}
	})
}
