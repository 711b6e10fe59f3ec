package guard

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

// On cgroup v2 memory.high sits below the kill level: a hog the kernel
// throttles there may never reach it, and the workspace crawls. Throttling
// (the high counter rising) with usage at the alert level, or with usage
// over memory.high and the workspace stalled on memory, counts as being
// held at the limit; throttling alone, as plain page-cache reclaim causes
// it below the alert level, does not, nor does memory tmpfs holds.
func TestMemoryHeldAtHigh(t *testing.T) {
	// memory.high is 0.9·1024 MiB = 921.6 MiB, the alert level 972.8 MiB.
	tests := []struct {
		name       string
		usage      uint64
		shmem      uint64
		highBefore uint64  // memory.events high at the first look
		highAfter  uint64  // and at the second
		stall      float64 // memory.pressure some avg10 at the second
		wantKilled []int
	}{
		{"throttled above the alert level: the largest goes at once", 975 * mib, 0, 10, 25, 0, []int{40}},
		{"at the alert level without new throttling: alert only", 975 * mib, 0, 10, 10, 0, nil},
		{"throttled below the alert level (reclaim keeping up): nothing", 930 * mib, 0, 10, 25, 0.05, nil},
		{"throttled over memory.high and stalling: the largest goes at once", 930 * mib, 0, 10, 25, 0.3, []int{40}},
		{"stalling over memory.high without new throttling: nothing", 930 * mib, 0, 10, 10, 0.3, nil},
		{"stalling just under memory.high: nothing", 920 * mib, 0, 10, 25, 0.9, nil},
		{"held over memory.high by tmpfs: no kill frees it", 930 * mib, 925 * mib, 10, 25, 0.3, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, testConfig())
			r.cg.usage, r.cg.shmem = tt.usage, tt.shmem
			r.cg.events.High = tt.highBefore
			r.g.checkMemory(context.Background()) // the first look only learns the counter
			if got := r.killed(); len(got) != 0 {
				t.Fatalf("the first look killed %v; a counter from before guardian looked proves nothing", got)
			}
			r.cg.events.High, r.cg.stall = tt.highAfter, tt.stall
			r.g.checkMemory(context.Background())
			if diff := cmp.Diff(tt.wantKilled, r.killed()); diff != "" {
				t.Errorf("killed (-want +got):\n%s", diff)
			}
			if len(tt.wantKilled) > 0 && r.killer.calls[0].Sig != unix.SIGKILL {
				t.Errorf("first signal = %v; held at the limit the victim gets SIGKILL at once", r.killer.calls[0].Sig)
			}
		})
	}
}
