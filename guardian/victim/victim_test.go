package victim

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const (
	sshdExe    = "/usr/sbin/sshd"
	sessionExe = "/usr/lib/openssh/sshd-session"
	bashExe    = "/usr/bin/bash"
)

func proc(pid, ppid int, start uint64, exe, comm string, rss, ticks uint64) Process {
	return Process{Identity: Identity{PID: pid, StartTime: start, Exe: exe, Cgroup: "/ws"}, PPID: ppid, Comm: comm, RSS: rss, CPUTicks: ticks}
}

// workspace is a typical snapshot: init, the sshd listener, one live
// connection (monitor + user child), the user's shell and its jobs.
func workspace() []Process {
	return []Process{
		proc(1, 0, 100, "/pause", "pause", 1<<20, 1),
		proc(7, 0, 110, "/usr/bin/sleep", "sleep", 1<<20, 1),
		proc(20, 7, 120, sshdExe, "sshd", 4<<20, 5),
		proc(30, 20, 300, sshdExe, "sshd", 5<<20, 2),
		proc(31, 30, 301, sshdExe, "sshd", 3<<20, 2),
		proc(32, 31, 302, bashExe, "bash", 2<<20, 1),
		proc(40, 32, 400, "/usr/bin/python3", "python3", 900<<20, 50),
		proc(41, 32, 401, "/usr/bin/python3", "sshd", 100<<20, 500), // renamed to sshd
		proc(42, 32, 402, "/tmp/x", "guardian", 10<<20, 300),        // renamed to guardian
		proc(43, 32, 403, sshdExe, "sshd", 1<<20, 0),                // user started sshd from the shell: depth 4
		proc(99, 0, 90, "/guardian", "guardian", 8<<20, 3),
	}
}

func TestProtect(t *testing.T) {
	listener := Identity{PID: 20, StartTime: 120, Exe: sshdExe, Cgroup: "/ws"}
	tests := []struct {
		name  string
		procs []Process
		rules Rules
		want  Protected
	}{
		{
			name:  "pid1, init, listener, live connection and self are protected; user processes and renamed ones are not",
			procs: workspace(),
			rules: Rules{ProtectPID1: true, ProtectInit: true, Listener: listener, Self: Key{99, 90}},
			want: Protected{
				{1, 100}: ReasonPID1, {99, 90}: ReasonSelf, {20, 120}: ReasonListener,
				{30, 300}: ReasonSession, {31, 301}: ReasonSession,
			},
		},
		{
			name:  "without pid1 the oldest process is the container init",
			procs: workspace()[1:],
			rules: Rules{ProtectInit: true, Listener: listener},
			want:  Protected{{99, 90}: ReasonInit, {20, 120}: ReasonListener, {30, 300}: ReasonSession, {31, 301}: ReasonSession},
		},
		{
			name:  "a listener whose start time changed (PID reused) protects nothing",
			procs: workspace(),
			rules: Rules{Listener: Identity{PID: 20, StartTime: 119, Exe: sshdExe}},
			want:  Protected{},
		},
		{
			name:  "no listener: no sshd is protected by its name",
			procs: workspace(),
			rules: Rules{},
			want:  Protected{},
		},
		{
			name: "OpenSSH >= 9.8 runs sshd-session per connection",
			procs: []Process{
				proc(20, 1, 120, sshdExe, "sshd", 1, 1),
				proc(30, 20, 300, sessionExe, "sshd-session", 1, 1),
				proc(31, 30, 301, sessionExe, "sshd-session", 1, 1),
				proc(32, 31, 302, bashExe, "bash", 1, 1),
			},
			rules: Rules{Listener: Identity{PID: 20, StartTime: 120, Exe: sshdExe}, SessionExes: []string{sessionExe}},
			want:  Protected{{20, 120}: ReasonListener, {30, 300}: ReasonSession, {31, 301}: ReasonSession},
		},
		{
			name: "a child older than its parent is a reused PID, not a session",
			procs: []Process{
				proc(20, 1, 120, sshdExe, "sshd", 1, 1),
				proc(30, 20, 100, sshdExe, "sshd", 1, 1),
			},
			rules: Rules{Listener: Identity{PID: 20, StartTime: 120, Exe: sshdExe}},
			want:  Protected{{20, 120}: ReasonListener},
		},
		{
			name:  "configured executables are protected by path",
			procs: workspace(),
			rules: Rules{Exes: []string{"/usr/bin/sleep"}},
			want:  Protected{{7, 110}: ReasonConfigured},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Protect(tt.procs, tt.rules)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Protect() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLargestRSS(t *testing.T) {
	procs := workspace()
	tests := []struct {
		name      string
		protected Protected
		wantPID   int
		wantOK    bool
	}{
		{"largest unprotected process", Protected{}, 40, true},
		{"skips protected even when largest", Protected{{40, 400}: ReasonConfigured}, 41, true},
		{"nothing when all protected", allProtected(procs), 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, ok := LargestRSS(procs, tt.protected)
			if ok != tt.wantOK || v.PID != tt.wantPID {
				t.Errorf("LargestRSS() = %d,%v; want %d,%v", v.PID, ok, tt.wantPID, tt.wantOK)
			}
		})
	}
}

func allProtected(procs []Process) Protected {
	p := Protected{}
	for _, x := range procs {
		p[x.Key()] = ReasonConfigured
	}
	return p
}

func TestTopCPU(t *testing.T) {
	prev := workspace()
	cur := workspace()
	cur[6].CPUTicks += 10                                               // pid 40: +10
	cur[7].CPUTicks += 400                                              // pid 41: +400
	cur[8].CPUTicks += 200                                              // pid 42: +200
	cur = append(cur, proc(50, 32, 500, "/usr/bin/yes", "yes", 1, 300)) // newborn, all 300 ticks count
	protected := Protected{{20, 120}: ReasonListener}
	pids := func(ps []Process) []int {
		var out []int
		for _, p := range ps {
			out = append(out, p.PID)
		}
		return out
	}
	tests := []struct {
		name string
		n    int
		want []int
	}{
		{"top one", 1, []int{41}},
		{"top three, newborn charged with all its ticks", 3, []int{41, 50, 42}},
		{"all unprotected ordered by use", -1, []int{41, 50, 42, 40, 1, 7, 30, 31, 32, 43, 99}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := pids(TopCPU(prev, cur, protected, tt.n))
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("TopCPU() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMemoryPolicy(t *testing.T) {
	m := MemoryPolicy{AlertFraction: 0.95, KillFraction: 0.98}
	tests := []struct {
		name         string
		usage, limit uint64
		want         MemoryLevel
	}{
		{"below alert", 940, 1000, MemoryOK},
		{"at alert", 950, 1000, MemoryAlert},
		{"just below kill", 979, 1000, MemoryAlert},
		{"at kill", 980, 1000, MemoryKill},
		{"unknown limit is never an emergency", 1 << 40, 0, MemoryOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := m.Level(tt.usage, tt.limit); got != tt.want {
				t.Errorf("Level(%d, %d) = %v; want %v", tt.usage, tt.limit, got, tt.want)
			}
		})
	}
	held := []struct {
		name        string
		usage, high uint64
		throttled   bool
		stall       float64
		want        bool
	}{
		{"throttled at the alert level", 950, 900, true, 0, true},
		{"throttled over memory.high and stalling", 910, 900, true, 0.25, true},
		{"throttled over memory.high, little stall", 910, 900, true, 0.05, false},
		{"stalling just under memory.high", 899, 900, true, 0.60, false},
		{"over memory.high and stalling, not throttled since the last look", 910, 900, false, 0.60, false},
	}
	mh := MemoryPolicy{AlertFraction: 0.95, KillFraction: 0.98, HeldStall: 0.2}
	for _, tt := range held {
		t.Run(tt.name, func(t *testing.T) {
			if got := mh.HeldAtHigh(tt.usage, tt.high, 1000, tt.throttled, tt.stall); got != tt.want {
				t.Errorf("HeldAtHigh(%d, %d, 1000, %v, %v) = %v; want %v", tt.usage, tt.high, tt.throttled, tt.stall, got, tt.want)
			}
		})
	}
	off := MemoryPolicy{AlertFraction: 0.95, KillFraction: 0.98}
	if off.HeldAtHigh(910, 900, 1000, true, 1) {
		t.Error("HeldStall 0 still reads stalls as held")
	}
	unfreeable := []struct {
		name                string
		usage, shmem, limit uint64
		want                bool
	}{
		{"tmpfs holds the memory", 990, 960, 1000, true},
		{"processes hold the memory", 990, 100, 1000, false},
		{"below the alert threshold", 900, 900, 1000, false},
		{"unknown limit", 990, 990, 0, false},
	}
	for _, tt := range unfreeable {
		t.Run(tt.name, func(t *testing.T) {
			if got := m.Unfreeable(tt.usage, tt.shmem, tt.limit); got != tt.want {
				t.Errorf("Unfreeable() = %v; want %v", got, tt.want)
			}
		})
	}
}

func TestKillBudget(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := KillBudget{Max: 3, Window: 30 * time.Second, Pause: 60 * time.Second}
	type step struct {
		at         time.Duration
		kill       bool // record a kill if allowed
		wantAllow  bool
		wantPaused bool
	}
	steps := []step{
		{0, true, true, false},
		{10 * time.Second, true, true, false},
		{35 * time.Second, true, true, false},   // the first kill fell out of the window
		{38 * time.Second, true, true, true},    // 3 kills within 30s: pause 60s
		{51 * time.Second, false, false, false}, // paused
		{97 * time.Second, false, false, false},
		{98 * time.Second, true, true, false}, // pause over, history cleared
	}
	for _, s := range steps {
		now := t0.Add(s.at)
		if got := b.Allow(now); got != s.wantAllow {
			t.Fatalf("at %v Allow() = %v; want %v", s.at, got, s.wantAllow)
		}
		if s.kill && s.wantAllow {
			if got := b.Record(now); got != s.wantPaused {
				t.Fatalf("at %v Record() paused = %v; want %v", s.at, got, s.wantPaused)
			}
		}
	}
}

func TestHangTracker(t *testing.T) {
	t0 := time.Unix(1000, 0)
	policy := HangPolicy{CPUFraction: 0.95, AlertAfter: 30 * time.Second, KillOne: 90 * time.Second, KillThree: 180 * time.Second, KillAll: 300 * time.Second, Recovery: 10 * time.Second}
	type obs struct {
		at    time.Duration
		cpu   float64
		sshOK bool
		want  HangAction
	}
	tests := []struct {
		name string
		obs  []obs
	}{
		{"high CPU with SSH reachable never escalates", []obs{
			{0, 1, true, HangAction{}}, {400 * time.Second, 1, true, HangAction{}},
		}},
		{"SSH unreachable at low CPU is not a CPU hang", []obs{
			{0, 0.5, false, HangAction{}}, {400 * time.Second, 0.5, false, HangAction{}},
		}},
		{"full escalation, one step each", []obs{
			{0, 1, false, HangAction{}},
			{29 * time.Second, 1, false, HangAction{Hung: 29 * time.Second}},
			{30 * time.Second, 1, false, HangAction{Alert: true, Hung: 30 * time.Second}},
			{35 * time.Second, 1, false, HangAction{Hung: 35 * time.Second}},
			{90 * time.Second, 1, false, HangAction{Alert: true, Kill: 1, Hung: 90 * time.Second}},
			{95 * time.Second, 1, false, HangAction{Hung: 95 * time.Second}},
			{180 * time.Second, 1, false, HangAction{Alert: true, Kill: 3, Hung: 180 * time.Second}},
			{300 * time.Second, 1, false, HangAction{Alert: true, Kill: -1, Hung: 300 * time.Second}},
			{310 * time.Second, 1, false, HangAction{Hung: 310 * time.Second}},
			{330 * time.Second, 1, false, HangAction{Alert: true, Kill: -1, Hung: 330 * time.Second}},
		}},
		{"a short CPU dip does not restart the escalation", []obs{
			{0, 1, false, HangAction{}},
			{30 * time.Second, 1, false, HangAction{Alert: true, Hung: 30 * time.Second}},
			{35 * time.Second, 0.9, false, HangAction{Hung: 35 * time.Second}},
			{40 * time.Second, 1, false, HangAction{Hung: 40 * time.Second}},
			{90 * time.Second, 1, false, HangAction{Alert: true, Kill: 1, Hung: 90 * time.Second}},
		}},
		{"CPU low for the recovery time ends the hang", []obs{
			{0, 1, false, HangAction{}},
			{30 * time.Second, 1, false, HangAction{Alert: true, Hung: 30 * time.Second}},
			{35 * time.Second, 0.5, false, HangAction{Hung: 35 * time.Second}},
			{45 * time.Second, 0.5, false, HangAction{}},
			{50 * time.Second, 1, false, HangAction{}},
			{80 * time.Second, 1, false, HangAction{Alert: true, Hung: 30 * time.Second}},
		}},
		{"one SSH success during a hang does not restart the escalation", []obs{
			{0, 1, false, HangAction{}},
			{30 * time.Second, 1, false, HangAction{Alert: true, Hung: 30 * time.Second}},
			{35 * time.Second, 1, true, HangAction{Hung: 35 * time.Second}},
			{40 * time.Second, 1, false, HangAction{Hung: 40 * time.Second}},
			{90 * time.Second, 1, false, HangAction{Alert: true, Kill: 1, Hung: 90 * time.Second}},
		}},
		{"SSH reachable for the recovery time ends the hang", []obs{
			{0, 1, false, HangAction{}},
			{90 * time.Second, 1, false, HangAction{Alert: true, Kill: 1, Hung: 90 * time.Second}},
			{95 * time.Second, 1, true, HangAction{Hung: 95 * time.Second}},
			{100 * time.Second, 1, true, HangAction{Hung: 100 * time.Second}},
			{105 * time.Second, 1, true, HangAction{}},
			{110 * time.Second, 1, false, HangAction{}},
			{140 * time.Second, 1, false, HangAction{Alert: true, Hung: 30 * time.Second}},
		}},
		{"low CPU and SSH reachable count together towards recovery", []obs{
			{0, 1, false, HangAction{}},
			{30 * time.Second, 1, false, HangAction{Alert: true, Hung: 30 * time.Second}},
			{35 * time.Second, 0.5, false, HangAction{Hung: 35 * time.Second}},
			{40 * time.Second, 1, true, HangAction{Hung: 40 * time.Second}},
			{45 * time.Second, 0.5, true, HangAction{}},
		}},
		{"a hang seen again restarts the recovery span", []obs{
			{0, 1, false, HangAction{}},
			{30 * time.Second, 1, false, HangAction{Alert: true, Hung: 30 * time.Second}},
			{35 * time.Second, 0.5, false, HangAction{Hung: 35 * time.Second}},
			{40 * time.Second, 1, false, HangAction{Hung: 40 * time.Second}},
			{45 * time.Second, 1, true, HangAction{Hung: 45 * time.Second}},
			{50 * time.Second, 0.5, false, HangAction{Hung: 50 * time.Second}},
			{55 * time.Second, 0.5, false, HangAction{}},
		}},
		{"no step while recovering; the due step follows when the hang resumes", []obs{
			{0, 1, false, HangAction{}},
			{85 * time.Second, 1, false, HangAction{Alert: true, Hung: 85 * time.Second}},
			{90 * time.Second, 0.5, false, HangAction{Hung: 90 * time.Second}},
			{95 * time.Second, 1, false, HangAction{Alert: true, Kill: 1, Hung: 95 * time.Second}},
		}},
		{"SSH reachable before any hang is nothing", []obs{
			{0, 0.5, true, HangAction{}}, {5 * time.Second, 1, true, HangAction{}},
		}},
		{"a late observation jumps to the highest due step", []obs{
			{0, 1, false, HangAction{}},
			{200 * time.Second, 1, false, HangAction{Alert: true, Kill: 3, Hung: 200 * time.Second}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := HangTracker{Policy: policy}
			for _, o := range tt.obs {
				got := h.Observe(t0.Add(o.at), o.cpu, o.sshOK)
				if diff := cmp.Diff(o.want, got); diff != "" {
					t.Fatalf("at %v (-want +got):\n%s", o.at, diff)
				}
			}
		})
	}
}

func TestCPUFraction(t *testing.T) {
	tests := []struct {
		name          string
		used, elapsed time.Duration
		cpus          float64
		want          float64
	}{
		{"one full CPU of two", 5 * time.Second, 5 * time.Second, 2, 0.5},
		{"quota of half a CPU saturated", 2500 * time.Millisecond, 5 * time.Second, 0.5, 1},
		{"no elapsed time", time.Second, 0, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := CPUFraction(tt.used, tt.elapsed, tt.cpus); got != tt.want {
				t.Errorf("CPUFraction() = %v; want %v", got, tt.want)
			}
		})
	}
}
