// Package victim holds guardian's decision logic, free of I/O: which
// processes are protected, which one a memory or CPU emergency kills, when
// repeated kills must pause, when a burst of process creation is a fork bomb,
// and how a CPU hang escalates. Callers feed it snapshots of the process table
// and cgroup counters together with the current time, so every rule is tested
// without a kernel and without sleeping.
package victim
