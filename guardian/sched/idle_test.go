package sched

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"labkeep/guardian/internal/poll"
)

// Demotion reaches every thread of a process, and restoring takes every
// thread back to normal scheduling. The process is a copy of this test
// binary, idling: a Go program with several threads.
func TestSetIdleProcessEveryThread(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_SYS_NICE) to take a process out of SCHED_IDLE again")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperIdle$")
	cmd.Env = append(os.Environ(), "SCHED_HELPER_IDLE=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pid := cmd.Process.Pid
	threads := func() []int {
		var out []int
		ds, _ := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
		for _, d := range ds {
			if tid, err := strconv.Atoi(d.Name()); err == nil {
				out = append(out, tid)
			}
		}
		return out
	}
	policies := func() map[int]int {
		out := map[int]int{}
		for _, tid := range threads() {
			if a, err := Get(tid); err == nil {
				out[tid] = a.Policy
			}
		}
		return out
	}
	poll.Eventually(t, 10*time.Second, func() (bool, string) {
		tids := threads()
		return len(tids) >= 2, fmt.Sprintf("the helper process has threads %v; want at least 2", tids)
	})
	if err := SetIdleProcess(pid); err != nil {
		t.Fatal(err)
	}
	for tid, p := range policies() {
		if p != unix.SCHED_IDLE {
			t.Errorf("thread %d of %d has policy %d after SetIdleProcess; want SCHED_IDLE", tid, pid, p)
		}
	}
	if err := SetNormalProcess(pid); err != nil {
		t.Fatal(err)
	}
	for tid, p := range policies() {
		if p != unix.SCHED_NORMAL {
			t.Errorf("thread %d of %d has policy %d after SetNormalProcess; want SCHED_NORMAL", tid, pid, p)
		}
	}
}

// TestHelperIdle is the child of TestSetIdleProcessEveryThread: a Go
// process (several threads) that waits to be killed.
func TestHelperIdle(t *testing.T) {
	if os.Getenv("SCHED_HELPER_IDLE") != "1" {
		t.Skip("helper process only")
	}
	time.Sleep(time.Hour)
}
