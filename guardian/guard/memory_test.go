package guard

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

// On cgroup v2 memory.high sits below the kill level: a hog the kernel
// throttles there never reaches it, and the workspace crawls. Throttling
// (the high counter rising) with usage at the alert level counts as being
// held at the limit; throttling alone, as plain page-cache reclaim causes
// it below the alert level, does not.
func TestMemoryHeldAtHigh(t *testing.T) {
	tests := []struct {
		name       string
		usage      uint64
		highBefore uint64 // memory.events high at the first look
		highAfter  uint64 // and at the second
		wantKilled []int
	}{
		{"throttled above the alert level: the largest goes at once", 975 * mib, 10, 25, []int{40}},
		{"at the alert level without new throttling: alert only", 975 * mib, 10, 10, nil},
		{"throttled below the alert level (reclaim keeping up): nothing", 930 * mib, 10, 25, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, testConfig())
			r.cg.usage = tt.usage
			r.cg.events.High = tt.highBefore
			r.g.checkMemory(context.Background()) // the first look only learns the counter
			if got := r.killed(); len(got) != 0 {
				t.Fatalf("the first look killed %v; a counter from before guardian looked proves nothing", got)
			}
			r.cg.events.High = tt.highAfter
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
