package victim

import "testing"

// bigWorkspace is a workspace at the default pids.max: 4096 processes.
func bigWorkspace() []Process {
	procs := workspace()
	for i := 0; len(procs) < 4096; i++ {
		procs = append(procs, proc(1000+i, 32, uint64(1000+i), "/bin/sh", "sh", uint64(i%97)<<20, uint64(i)))
	}
	return procs
}

// Guardian computes the protected set on every emergency action; at
// pids.max this must stay far below a millisecond.
func BenchmarkProtect4096(b *testing.B) {
	procs := bigWorkspace()
	rules := Rules{ProtectPID1: true, ProtectInit: true, Listener: Identity{PID: 20, StartTime: 120, Exe: sshdExe, Cgroup: "/ws"}}
	b.ReportAllocs()
	for b.Loop() {
		Protect(procs, rules)
	}
}

func BenchmarkLargestRSS4096(b *testing.B) {
	procs := bigWorkspace()
	prot := Protect(procs, Rules{ProtectInit: true})
	for b.Loop() {
		LargestRSS(procs, prot)
	}
}
