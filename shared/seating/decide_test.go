package seating

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/labs"
)

func TestDecide(t *testing.T) {
	vm3 := Capacity{Kind: labs.KindVM, Need: 3, Limit: 8}
	pod := Capacity{Kind: labs.KindPod, Need: 1, Limit: 2}
	tests := map[string]struct {
		in   Input
		want Decision
	}{
		"room and nobody waits: provision cold": {
			Input{Lab: "three", Capacity: vm3, Used: 5}, Decision{Verdict: Cold}},
		"one too many: refused with the bucket's label": {
			Input{Lab: "three", Capacity: vm3, Used: 6}, Decision{Verdict: Refuse, Reason: "6 of 8 VMs in use, lab three needs 3"}},
		"one too many, willing to wait: queued": {
			Input{Lab: "shell", Capacity: pod, Used: 2, Wait: true}, Decision{Verdict: Queue, Reason: "2 of 2 workspace Pods in use, lab shell needs 1"}},
		"room, but someone waits: an open never jumps the line": {
			Input{Lab: "three", Capacity: vm3, Waiting: 2}, Decision{Verdict: Refuse, Reason: "2 students wait for capacity"}},
		"room, someone waits, willing to wait: queued behind them": {
			Input{Lab: "three", Capacity: vm3, Waiting: 1, Wait: true}, Decision{Verdict: Queue, Reason: "1 students wait for capacity"}},
		"a ready warm instance and nobody waits: claim it, whatever the count": {
			Input{Lab: "three", Capacity: vm3, Used: 8, Warm: true}, Decision{Verdict: Claim}},
		"a ready warm instance but someone waits: the line comes first": {
			Input{Lab: "three", Capacity: vm3, Waiting: 1, Warm: true}, Decision{Verdict: Refuse, Reason: "1 students wait for capacity"}},
		"the count failed: the ResourceQuota decides": {
			Input{Lab: "three", Capacity: vm3, Used: 99, CountFailed: true}, Decision{Verdict: Cold}},
		"the count failed and someone waits: still no jumping": {
			Input{Lab: "three", Capacity: vm3, CountFailed: true, Waiting: 1}, Decision{Verdict: Refuse, Reason: "1 students wait for capacity"}},
		"the count failed while reserved seats are held: they stay the classes'": {
			Input{Lab: "shell", Capacity: Capacity{Kind: labs.KindPod, Need: 1, Limit: 8}, CountFailed: true, Reserved: 5},
			Decision{Verdict: Refuse, Reason: "workspace Pods in use cannot be counted now and 5 are held for reserved classes"}},
		"the count failed, a member takes their seat: the ResourceQuota decides": {
			Input{Lab: "shell", Capacity: Capacity{Kind: labs.KindPod, Need: 1, Limit: 8}, CountFailed: true, Reserved: 5, Seat: true}, Decision{Verdict: Cold}},
		"reserved seats held: room only beside them": {
			Input{Lab: "shell", Capacity: Capacity{Kind: labs.KindPod, Need: 1, Limit: 8}, Used: 3, Reserved: 5},
			Decision{Verdict: Refuse, Reason: "3 of 8 workspace Pods in use and 5 held for reserved classes, lab shell needs 1"}},
		"reserved seats held, room beside them: provision cold": {
			Input{Lab: "shell", Capacity: Capacity{Kind: labs.KindPod, Need: 1, Limit: 8}, Used: 2, Reserved: 5}, Decision{Verdict: Cold}},
		"a reserved seat: its capacity is among the held, so in while they fit": {
			Input{Lab: "shell", Capacity: Capacity{Kind: labs.KindPod, Need: 1, Limit: 8}, Used: 3, Reserved: 5, Seat: true}, Decision{Verdict: Cold}},
		"a reserved seat goes ahead of the line": {
			Input{Lab: "shell", Capacity: Capacity{Kind: labs.KindPod, Need: 1, Limit: 8}, Used: 3, Reserved: 5, Seat: true, Waiting: 12}, Decision{Verdict: Cold}},
		"a reserved seat while labs started before the window fill the capacity: refused, even to one who would wait (never behind the line)": {
			Input{Lab: "shell", Capacity: Capacity{Kind: labs.KindPod, Need: 1, Limit: 8}, Used: 6, Reserved: 5, Seat: true, Wait: true},
			Decision{Verdict: Refuse, Reason: "6 of 8 workspace Pods in use and 5 held for reserved classes, your seat among them: it is free once a lab that started before your class ends; try again then"}},
		"a reserved seat and a warm instance ready: claim it, ahead of the line": {
			Input{Lab: "shell", Capacity: Capacity{Kind: labs.KindPod, Need: 1, Limit: 8}, Used: 8, Reserved: 5, Seat: true, Waiting: 3, Warm: true}, Decision{Verdict: Claim}},
		"a lab needing nothing from a bucket: provision cold": {
			Input{Lab: "none", Capacity: Capacity{Kind: labs.KindVM, Limit: 8}, Used: 9, Waiting: 3}, Decision{Verdict: Cold}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Decide(tc.in)); diff != "" {
				t.Errorf("Decide (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCapacityOfIsKeyedByKind(t *testing.T) {
	limits := Limits{MaxVMs: 8, MaxPods: 20}
	got := []Capacity{
		CapacityOf(labs.Lab{Kind: labs.KindVM, Nodes: []labs.Node{{Name: "a"}, {Name: "b"}}}, limits),
		CapacityOf(labs.Lab{Kind: labs.KindPod, Nodes: []labs.Node{{Name: "w"}}}, limits),
	}
	want := []Capacity{{Kind: labs.KindVM, Need: 2, Limit: 8}, {Kind: labs.KindPod, Need: 1, Limit: 20}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("CapacityOf (-want +got):\n%s", diff)
	}
}
