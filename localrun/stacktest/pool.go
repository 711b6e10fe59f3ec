package stacktest

import (
	"context"
	"fmt"
	"time"

	"labkeep/shared/reap"
)

// FillPool runs the reaper (which keeps the warm pool) until lab has want
// ready unclaimed instances and none starting, and returns their session
// ids, oldest first. A run that fails, or takes a pool instance for an
// orphan or a ghost, fails the test; timeout bounds the wait.
func (d *Deployment) FillPool(lab string, want int, timeout time.Duration) []string {
	d.t.Helper()
	var ids []string
	Eventually(d.t, timeout, func() (bool, string) {
		rep, err := d.App.Reaper.RunOnce(context.Background(), reap.TriggerSchedule)
		if err != nil {
			d.t.Fatal(err)
		}
		if rep.Counts[reap.Orphan] != 0 || rep.Counts[reap.Ghost] != 0 || len(rep.Failures) != 0 {
			d.t.Fatalf("reaper run took pool instances for orphans or ghosts, or failed: counts %v failures %v items %v", rep.Counts, rep.Failures, rep.Items)
		}
		// Starting is read first: meanwhile a starting instance can only
		// turn ready or end, and only a reaper run starts one, so no
		// instance slips between the two reads unseen.
		starting := d.Count(`SELECT count(*) FROM sessions WHERE lab = $1 AND pool = 'idle' AND status = 'provisioning'`, lab)
		ids = d.Strings(`SELECT id::text FROM sessions WHERE lab = $1 AND pool = 'idle' AND status = 'running' ORDER BY started_at`, lab)
		return len(ids) == want && starting == 0, fmt.Sprintf("%s pool: %d ready, %d starting, want %d ready", lab, len(ids), starting, want)
	})
	return ids
}
