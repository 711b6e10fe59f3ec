package victim

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSpareSmallLogins(t *testing.T) {
	const sshd, bash, dash = "/usr/sbin/sshd", "/usr/bin/bash", "/usr/bin/dash"
	listener := proc(20, 1, 120, sshd, "sshd", 4<<20, 0)
	session := proc(30, 20, 300, sshd, "sshd", 2<<20, 0)
	protected := Protected{listener.Key(): ReasonListener, session.Key(): ReasonSession}
	// bomb is a shell running a bomb of n processes below parent.
	bomb := func(parent, first, n int) []Process {
		out := []Process{proc(first, parent, 1000, bash, "bash", 1<<20, 0)}
		for i := 1; i < n; i++ {
			out = append(out, proc(first+i, first+(i-1)/2, 1001, dash, "sh", 1<<20, 0))
		}
		return out
	}
	login := []Process{proc(40, 30, 2000, bash, "bash", 1<<20, 0), proc(41, 40, 2001, "/usr/bin/echo", "echo", 1<<20, 0)}
	tests := []struct {
		name  string
		procs []Process
		want  []int // PIDs killed
	}{
		{"a login at work beside a bomb started elsewhere is spared; the bomb is not",
			slices.Concat([]Process{listener, session}, login, bomb(1, 100, 5)), []int{100, 101, 102, 103, 104}},
		{"a bomb run from a login shell is killed, shell included",
			slices.Concat([]Process{listener, session}, bomb(30, 100, 40)), pids(bomb(30, 100, 40))},
		{"a bomb that has only just started in a login is spared this round",
			slices.Concat([]Process{listener, session}, bomb(30, 100, 3)), nil},
		{"without a session nothing is spared",
			slices.Concat([]Process{listener}, []Process{proc(40, 20, 2000, bash, "bash", 1<<20, 0)}), []int{40}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := pids(SpareSmallLogins(tt.procs, protected, 16))
			slices.Sort(got)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("killed (-want +got):\n%s", diff)
			}
		})
	}
}

func pids(procs []Process) []int {
	var out []int
	for _, p := range procs {
		out = append(out, p.PID)
	}
	return out
}
