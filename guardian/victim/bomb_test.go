package victim

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestBombDetector(t *testing.T) {
	policy := BombPolicy{Limit: 4096, Refused: 50, Window: 10 * time.Second, GrowthFraction: 0.25, Horizon: time.Second}
	// step is one look at the workspace, ms after the first.
	type step struct {
		ms           int
		procs, tasks int
		refused      uint64
	}
	// every50ms builds samples 50 ms apart with tasks == procs.
	every50ms := func(refused uint64, procs ...int) []step {
		var out []step
		for i, p := range procs {
			out = append(out, step{50 * i, p, p, refused})
		}
		return out
	}
	tests := []struct {
		name  string
		steps []step
		want  []string // the verdict's reason at each step, "" for no bomb
	}{
		{
			name:  "a make -j16 build starts and reaps tens of processes and is no bomb",
			steps: every50ms(0, 3, 20, 45, 70, 66, 80, 72, 90, 40, 3),
			want:  []string{"", "", "", "", "", "", "", "", "", ""},
		},
		{
			name:  "a program starting 2000 threads at once is one process and no bomb",
			steps: []step{{0, 3, 3, 0}, {50, 3, 900, 0}, {100, 3, 2003, 0}, {150, 3, 2003, 0}},
			want:  []string{"", "", "", ""},
		},
		{
			name:  "a bomb growing towards the limit is one once it holds a quarter of it and reaches the limit within the horizon",
			steps: every50ms(0, 3, 300, 600, 900, 1200, 1500),
			want:  []string{"", "", "", "", "growth", "growth"},
		},
		{
			name:  "a bomb at the limit still forking is refused again and again",
			steps: []step{{0, 400, 4096, 100}, {50, 400, 4096, 130}, {100, 400, 4096, 220}},
			want:  []string{"", "", "refused"},
		},
		{
			name:  "thousands of processes at the limit are a bomb at the first refused fork",
			steps: []step{{0, 3700, 4096, 0}, {50, 3700, 4096, 0}, {100, 3690, 4096, 1}},
			want:  []string{"", "", "exhausted"},
		},
		{
			name:  "a few refused forks with fewer processes than a quarter of the limit are no bomb",
			steps: []step{{0, 1000, 4096, 0}, {50, 1000, 4096, 3}, {100, 1000, 4096, 6}},
			want:  []string{"", "", ""},
		},
		{
			name:  "one fork refused to a program at the limit is no bomb",
			steps: []step{{0, 10, 4096, 0}, {50, 10, 4096, 1}, {100, 10, 4096, 1}, {150, 10, 4096, 1}},
			want:  []string{"", "", "", ""},
		},
		{
			name:  "refusals counted only within the window",
			steps: []step{{0, 10, 4000, 0}, {50, 10, 4000, 30}, {11050, 10, 4000, 60}},
			want:  []string{"", "", ""},
		},
		{
			name:  "a burst of workers that stops growing is no bomb",
			steps: every50ms(0, 10, 1510, 1510, 1510),
			want:  []string{"", "", "", ""},
		},
		{
			name:  "slow growth that would take far longer than the horizon to reach the limit is no bomb",
			steps: every50ms(0, 1100, 1110, 1120, 1130),
			want:  []string{"", "", "", ""},
		},
		{
			name:  "fast growth far below a quarter of the limit is no bomb yet",
			steps: every50ms(0, 10, 300, 600, 900),
			want:  []string{"", "", "", ""},
		},
		{
			name: "remaining tasks, not processes, decide when the limit is reached",
			// 1100 processes with 3000 threads more: 600 processes/s reach
			// the limit within a second.
			steps: []step{{0, 1000, 3900, 0}, {50, 1050, 3950, 0}, {100, 1100, 4000, 0}},
			want:  []string{"", "", "growth"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &BombDetector{Policy: policy}
			t0 := time.Unix(1000, 0)
			var got []string
			for _, s := range tt.steps {
				v := d.Observe(BombSample{At: t0.Add(time.Duration(s.ms) * time.Millisecond), Procs: s.procs, Tasks: s.tasks, Refused: s.refused})
				if v.Bomb != (v.Reason != "") {
					t.Errorf("verdict %+v: Bomb and Reason disagree", v)
				}
				got = append(got, v.Reason)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("reasons (-want +got):\n%s", diff)
			}
		})
	}
}

// After Reset the next sample is a new baseline: what was refused or grown
// before the containment counts no more.
func TestBombDetectorReset(t *testing.T) {
	d := &BombDetector{Policy: BombPolicy{Limit: 4096, Refused: 50, Window: 10 * time.Second, GrowthFraction: 0.25, Horizon: time.Second}}
	t0 := time.Unix(1000, 0)
	obs := func(ms, procs int, refused uint64) BombVerdict {
		t.Helper()
		return d.Observe(BombSample{At: t0.Add(time.Duration(ms) * time.Millisecond), Procs: procs, Tasks: procs, Refused: refused})
	}
	obs(0, 4000, 0)
	if v := obs(50, 4000, 500); !v.Bomb {
		t.Fatalf("500 refused forks: %+v; want a bomb", v)
	}
	d.Reset()
	var got []bool
	for i, s := range []struct {
		procs   int
		refused uint64
	}{{5, 500}, {5, 510}, {1500, 510}, {1500, 510}} {
		got = append(got, obs(100+50*i, s.procs, s.refused).Bomb)
	}
	if diff := cmp.Diff([]bool{false, false, false, false}, got); diff != "" {
		t.Errorf("bomb after reset (-want +got):\n%s", diff)
	}
}

// A growing workspace is a bomb when its processes replicate: many of them
// fork two or more of the others, or most of them outlived the parent that
// started them. Workers fanned out from one parent and compiles running in
// chains are not.
func TestBombDetectorBranching(t *testing.T) {
	d := &BombDetector{Policy: BombPolicy{Limit: 4096, GrowthFraction: 0.125, Horizon: time.Second, BranchFraction: 0.125}}
	// tree returns n processes from pid 100 on, each the child of parent(i)
	// (a pid; 1 is outside the workspace).
	tree := func(n int, parent func(i int) int) []Process {
		out := make([]Process, n)
		for i := range out {
			out[i] = Process{Identity: Identity{PID: 100 + i}, PPID: parent(i)}
		}
		return out
	}
	bomb := tree(600, func(i int) int { // a binary tree: every process starts two copies of itself
		if i == 0 {
			return 1
		}
		return 100 + (i-1)/2
	})
	pool := tree(600, func(i int) int { // one loop or pool starting workers
		if i == 0 {
			return 1
		}
		return 100
	})
	build := tree(600, func(i int) int { // make with 150 jobs, each sh → gcc → cc1
		switch {
		case i == 0:
			return 1
		case (i-1)%4 == 0:
			return 100
		default:
			return 100 + i - 1
		}
	})
	// The classic bomb's copies exit once they started their two: the
	// Pod's PID 1 (outside the workspace) is the parent of most, a few
	// are still parents of two.
	orphaned := tree(600, func(i int) int {
		if i < 20 {
			return 1
		}
		return 100 + (i-20)/2
	})
	for i := 40; i < len(orphaned); i++ {
		orphaned[i].PPID = 1
	}
	growing := BombVerdict{Growing: true}
	tests := []struct {
		name        string
		v           BombVerdict
		procs       []Process
		wantReason  string
		wantParents int
		wantOrphans int
	}{
		{"a binary tree of copies is a bomb", growing, bomb, "branching", 299, 1},
		{"copies that outlive their parents are a bomb", growing, orphaned, "orphans", 10, 580},
		{"workers fanned out from one parent are no bomb", growing, pool, "", 1, 1},
		{"a parallel build's chains are no bomb", growing, build, "", 1, 1},
		{"processes that are not growing are not looked at", BombVerdict{}, bomb, "", 0, 0},
		{"a bomb already found keeps its reason", BombVerdict{Growing: true, Bomb: true, Reason: "growth"}, bomb, "growth", 0, 0},
		{"no snapshot is no bomb", growing, nil, "", 0, 0},
		{"a few logins around sshd (tasks not yet reaped after a containment) are no population", growing, tree(8, func(i int) int {
			return []int{1, 100, 100, 101, 101, 102, 103, 104}[i]
		}), "", 2, 1},
		{"a few orphans (tasks not yet reaped after a containment) are no population", growing, tree(40, func(int) int { return 1 }), "", 0, 40},
		{"fewer than a quarter orphaned beside a pool's workers are no bomb", growing, tree(600, func(i int) int {
			if i < 149 {
				return 1
			}
			return 100
		}), "", 1, 149},
		{"a young bomb of 130 copies has the parents it takes", growing, bomb[:130], "branching", 64, 1},
		{"a bomb of 120 copies is not yet a population", growing, bomb[:120], "", 59, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := d.Branching(tt.v, tt.procs)
			if v.Bomb != (v.Reason != "") {
				t.Errorf("verdict %+v: Bomb and Reason disagree", v)
			}
			if diff := cmp.Diff([]any{tt.wantReason, tt.wantParents, tt.wantOrphans}, []any{v.Reason, v.Parents, v.Orphans}); diff != "" {
				t.Errorf("reason, parents, orphans (-want +got):\n%s", diff)
			}
		})
	}
}

// Growing (worth a look at who forks) needs the processes to rise and the
// tasks, threads too, to reach the growth fraction: a bomb of threaded
// programs holds many tasks in few processes, and a threaded program
// alone never grows in processes.
func TestBombDetectorGrowing(t *testing.T) {
	policy := BombPolicy{Limit: 4096, GrowthFraction: 0.125, Horizon: time.Second, BranchFraction: 0.125}
	type look struct{ procs, tasks int }
	tests := []struct {
		name  string
		looks []look
		want  []bool
	}{
		{"threaded copies rising past the fraction in tasks", []look{{100, 450}, {115, 500}, {130, 560}, {145, 620}}, []bool{false, false, true, true}},
		{"one program adding threads", []look{{3, 300}, {3, 900}, {3, 2000}}, []bool{false, false, false}},
		{"processes rising below the fraction", []look{{100, 100}, {200, 200}, {300, 300}}, []bool{false, false, false}},
		{"many tasks that stopped rising", []look{{600, 600}, {700, 700}, {700, 700}}, []bool{false, false, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &BombDetector{Policy: policy}
			t0 := time.Unix(1000, 0)
			var got []bool
			for i, l := range tt.looks {
				v := d.Observe(BombSample{At: t0.Add(time.Duration(50*i) * time.Millisecond), Procs: l.procs, Tasks: l.tasks})
				got = append(got, v.Growing)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Growing (-want +got):\n%s", diff)
			}
		})
	}
}
