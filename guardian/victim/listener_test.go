package victim

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestCheckListener(t *testing.T) {
	sshd := Executable{Path: sshdExe, File: FileID{Dev: 64, Ino: 1001}}
	replaced := Executable{Path: sshdExe, File: FileID{Dev: 64, Ino: 2002}} // a new file at sshd's path
	fake := Executable{Path: "/tmp/fakesshd", File: FileID{Dev: 64, Ino: 3003}}
	tests := []struct {
		name  string
		exe   Executable
		trust SSHDTrust
		want  ListenerVerdict
	}{
		{
			name:  "the first holder of the guarded cgroup qualifies and is recorded",
			exe:   sshd,
			trust: SSHDTrust{},
			want:  ListenerVerdict{Qualifies: true, Record: true},
		},
		{
			name:  "the recorded sshd qualifies again",
			exe:   sshd,
			trust: SSHDTrust{Want: sshd},
			want:  ListenerVerdict{Qualifies: true},
		},
		{
			name:  "another program on the port does not qualify",
			exe:   fake,
			trust: SSHDTrust{Want: sshd},
			want:  ListenerVerdict{Why: "it runs /tmp/fakesshd (64:3003), not /usr/sbin/sshd (64:1001), the sshd the workspace started with"},
		},
		{
			name:  "a replaced sshd binary at the same path does not qualify",
			exe:   replaced,
			trust: SSHDTrust{Want: sshd},
			want:  ListenerVerdict{Why: "it runs /usr/sbin/sshd (64:2002), not /usr/sbin/sshd (64:1001), the sshd the workspace started with"},
		},
		{
			name:  "a holder whose executable cannot be identified does not qualify, even first",
			exe:   Executable{Path: sshdExe},
			trust: SSHDTrust{},
			want:  ListenerVerdict{Why: `its executable "/usr/sbin/sshd" cannot be identified`},
		},
		{
			name:  "the configured sshd qualifies and is not recorded",
			exe:   sshd,
			trust: SSHDTrust{Want: sshd, Configured: true},
			want:  ListenerVerdict{Qualifies: true},
		},
		{
			name:  "another program does not qualify against the configured sshd",
			exe:   fake,
			trust: SSHDTrust{Want: sshd, Configured: true},
			want:  ListenerVerdict{Why: "it runs /tmp/fakesshd (64:3003), not the configured sshd /usr/sbin/sshd (64:1001)"},
		},
		{
			name:  "while the configured sshd is not found nothing qualifies, and the holder is not recorded",
			exe:   sshd,
			trust: SSHDTrust{Want: Executable{Path: sshdExe}, Configured: true},
			want:  ListenerVerdict{Why: `the configured sshd "/usr/sbin/sshd" was not found in the container`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := CheckListener(tt.exe, tt.trust)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("CheckListener() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRTOverBudget(t *testing.T) {
	tests := []struct {
		name      string
		usage     RTUsage
		want      float64
		wantOver  bool
		threshold float64
	}{
		{name: "an idle listener is within budget", usage: RTUsage{Ticks: 0, Elapsed: time.Second}, want: 0, threshold: 0.05},
		{name: "accepting logins is within budget", usage: RTUsage{Ticks: 3, Elapsed: time.Second}, want: 0.03, threshold: 0.05},
		{name: "exactly the budget is allowed", usage: RTUsage{Ticks: 5, Elapsed: time.Second}, want: 0.05, threshold: 0.05},
		{name: "a spinning real-time process is over budget", usage: RTUsage{Ticks: 95, Elapsed: time.Second}, want: 0.95, wantOver: true, threshold: 0.05},
		{name: "the share is per second of the window", usage: RTUsage{Ticks: 12, Elapsed: 2 * time.Second}, want: 0.06, wantOver: true, threshold: 0.05},
		{name: "an empty window decides nothing", usage: RTUsage{Ticks: 50, Elapsed: 0}, want: 0, threshold: 0.05},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			share, over := RTOverBudget(tt.usage, tt.threshold)
			if diff := cmp.Diff([]any{tt.want, tt.wantOver}, []any{share, over}, cmp.Comparer(func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 })); diff != "" {
				t.Errorf("RTOverBudget() (-want +got):\n%s", diff)
			}
		})
	}
}
