package procfs

import (
	"os"
	"strconv"
	"testing"
)

// BenchmarkSnapshot reads every process of this machine, as guardian reads
// the workspace's on each scan.
func BenchmarkSnapshot(b *testing.B) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		b.Fatal(err)
	}
	var pids []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	fs := New("/proc", "memory")
	for b.Loop() {
		if _, err := fs.Snapshot(pids); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*len(pids)), "µs/proc")
}
