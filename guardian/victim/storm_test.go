package victim

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestStormTracker(t *testing.T) {
	policy := StormPolicy{CPUFraction: 0.9, Runnable: 2, MinShare: 0.01, Calm: 5 * time.Second}
	sshd := proc(20, 1, 120, sshdExe, "sshd", 4<<20, 0)
	shell := proc(32, 20, 302, bashExe, "bash", 2<<20, 0)
	spinner := func(pid int, ticks uint64) Process {
		return proc(pid, 32, uint64(1000+pid), "/usr/bin/spin", "spin", 1<<20, ticks)
	}
	running := func(p Process) Process { p.State = "R"; return p }
	protected := Protected{sshd.Key(): ReasonListener}
	// obs is one observation one second after the previous one.
	type obs struct {
		cpu   float64
		procs []Process
	}
	type got struct {
		Saturated bool
		Demote    []int
		Restore   []int
	}
	tests := []struct {
		name string
		obs  []obs
		want []got
	}{
		{
			name: "below saturation nothing is demoted, however busy a process is",
			obs:  []obs{{0.5, []Process{sshd, shell, spinner(50, 0)}}, {0.5, []Process{sshd, shell, spinner(50, 50)}}},
			want: []got{{}, {}},
		},
		{
			name: "saturated: every unprotected process using CPU is demoted, the idle shell and the busy listener are not",
			obs: []obs{
				{0.5, []Process{sshd, shell, spinner(50, 0), spinner(51, 0)}},
				{1.0, []Process{proc(20, 1, 120, sshdExe, "sshd", 4<<20, 40), shell, spinner(50, 3), spinner(51, 2)}},
			},
			want: []got{{}, {Saturated: true, Demote: []int{50, 51}}},
		},
		{
			name: "on a busy host the quota is not reached, but more runnable processes than twice the CPUs at two looks in a row are a storm",
			obs: []obs{
				{0.4, []Process{sshd, shell, running(spinner(50, 0)), running(spinner(51, 0)), running(spinner(52, 0))}},
				{0.4, []Process{sshd, shell, running(spinner(50, 2)), running(spinner(51, 1)), running(spinner(52, 1))}},
			},
			want: []got{{}, {Saturated: true, Demote: []int{50, 51, 52}}},
		},
		{
			name: "processes runnable at one look only (starting up) are no storm",
			obs: []obs{
				{0.4, []Process{sshd, shell, spinner(50, 0), spinner(51, 0), spinner(52, 0)}},
				{0.4, []Process{sshd, shell, running(spinner(50, 2)), running(spinner(51, 1)), running(spinner(52, 1))}},
			},
			want: []got{{}, {}},
		},
		{
			name: "two runnable processes on 1.5 CPUs are no storm",
			obs: []obs{
				{0.4, []Process{sshd, shell, spinner(50, 0), spinner(51, 0)}},
				{0.4, []Process{sshd, shell, running(spinner(50, 40)), running(spinner(51, 40))}},
			},
			want: []got{{}, {}},
		},
		{
			name: "a process born during the storm is charged with all its ticks",
			obs: []obs{
				{1.0, []Process{sshd, shell}},
				{1.0, []Process{sshd, shell, spinner(60, 5)}},
			},
			want: []got{{Saturated: true}, {Saturated: true, Demote: []int{60}}},
		},
		{
			name: "a demoted process stays demoted while the storm lasts, even once it gets little CPU",
			obs: []obs{
				{1.0, []Process{sshd, shell, spinner(50, 0)}},
				{1.0, []Process{sshd, shell, spinner(50, 3)}},
				{1.0, []Process{sshd, shell, spinner(50, 3)}},
			},
			want: []got{{Saturated: true}, {Saturated: true, Demote: []int{50}}, {Saturated: true, Demote: []int{50}}},
		},
		{
			name: "demoted processes get normal scheduling back only after Calm without saturation; the dead are forgotten",
			obs: []obs{
				{1.0, []Process{sshd, shell, spinner(50, 0), spinner(51, 0)}},
				{1.0, []Process{sshd, shell, spinner(50, 3), spinner(51, 3)}},
				{0.3, []Process{sshd, shell, spinner(50, 3)}},
				{0.3, []Process{sshd, shell, spinner(50, 3)}},
				{0.3, []Process{sshd, shell, spinner(50, 3)}},
				{0.3, []Process{sshd, shell, spinner(50, 3)}},
				{0.3, []Process{sshd, shell, spinner(50, 3)}},
				{0.3, []Process{sshd, shell, spinner(50, 3)}},
				{0.3, []Process{sshd, shell, spinner(50, 3)}},
			},
			want: []got{
				{Saturated: true}, {Saturated: true, Demote: []int{50, 51}},
				{Demote: []int{50}}, {Demote: []int{50}}, {Demote: []int{50}}, {Demote: []int{50}}, {Demote: []int{50}},
				{Restore: []int{50}}, {},
			},
		},
		{
			name: "saturation again during the calm span starts it over",
			obs: []obs{
				{1.0, []Process{sshd, spinner(50, 0)}},
				{1.0, []Process{sshd, spinner(50, 3)}},
				{0.3, []Process{sshd, spinner(50, 3)}},
				{0.3, []Process{sshd, spinner(50, 3)}},
				{0.3, []Process{sshd, spinner(50, 3)}},
				{1.0, []Process{sshd, spinner(50, 3)}},
				{0.3, []Process{sshd, spinner(50, 3)}},
				{0.3, []Process{sshd, spinner(50, 3)}},
			},
			want: []got{
				{Saturated: true}, {Saturated: true, Demote: []int{50}},
				{Demote: []int{50}}, {Demote: []int{50}}, {Demote: []int{50}},
				{Saturated: true, Demote: []int{50}}, {Demote: []int{50}}, {Demote: []int{50}},
			},
		},
	}
	pids := func(ps []Process) []int {
		var out []int
		for _, p := range ps {
			out = append(out, p.PID)
		}
		return out
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := &StormTracker{Policy: policy}
			t0 := time.Unix(1000, 0)
			var prev []Process
			var out []got
			for i, o := range tt.obs {
				a := tr.Observe(t0.Add(time.Duration(i)*time.Second), o.cpu, 1.5, time.Second, prev, o.procs, protected)
				out = append(out, got{a.Saturated, pids(a.Demote), pids(a.Restore)})
				prev = o.procs
			}
			if diff := cmp.Diff(tt.want, out); diff != "" {
				t.Errorf("actions (-want +got):\n%s", diff)
			}
		})
	}
}
