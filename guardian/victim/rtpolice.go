package victim

import "time"

// TicksPerSecond is the unit of Process.CPUTicks: the kernel reports CPU
// times in /proc/PID/stat in USER_HZ ticks, 100 a second by its ABI.
const TicksPerSecond = 100

// RTUsage is the CPU a real-time process used over one policing window.
type RTUsage struct {
	Ticks   uint64        // utime+stime consumed during the window, in clock ticks
	Elapsed time.Duration // the window's length
}

// Share returns the fraction of one CPU used, 0 for an empty window.
func (u RTUsage) Share() float64 {
	if u.Elapsed <= 0 {
		return 0
	}
	return float64(u.Ticks) / TicksPerSecond / u.Elapsed.Seconds()
}

// RTOverBudget reports whether a real-time process used more than
// maxShare of one CPU over the window, and the share it used. A protected
// process runs real-time to be scheduled at once, not to compute: the
// sshd listener accepts and forks, a few milliseconds a second at most. A
// real-time task escapes the CFS quota and preempts every normal task on
// its core, so one that computes is taking the workspace's CPU from
// everyone and loses real-time scheduling.
func RTOverBudget(u RTUsage, maxShare float64) (share float64, over bool) {
	share = u.Share()
	return share, share > maxShare
}
