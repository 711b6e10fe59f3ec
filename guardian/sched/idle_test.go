package sched

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
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
	// The helper says when its threads run and its start-up has ended.
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != helperReady+"\n" {
		t.Fatalf("helper said %q, %v; want %q", line, err, helperReady)
	}
	if tids := threads(); len(tids) < helperThreads {
		t.Fatalf("the helper process has threads %v; want at least %d", tids, helperThreads)
	}
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

const (
	helperReady   = "threads running"
	helperThreads = 4
)

// TestHelperIdle is the child of TestSetIdleProcessEveryThread: a Go
// process that starts helperThreads threads of its own, says so on stdout
// and waits to be killed.
func TestHelperIdle(t *testing.T) {
	if os.Getenv("SCHED_HELPER_IDLE") != "1" {
		t.Skip("helper process only")
	}
	started := make(chan struct{})
	for i := 0; i < helperThreads; i++ {
		go func() {
			runtime.LockOSThread() // this goroutine keeps a thread of its own
			started <- struct{}{}
			select {}
		}()
	}
	for i := 0; i < helperThreads; i++ {
		<-started
	}
	// The runtime goes on starting threads for a while after main starts
	// (seen: up to 8 more within tens of milliseconds, longer on a loaded
	// machine); one in creation while the walk runs copies its creator's
	// old policy. Guardian mends such a thread at its next look; this test
	// shows one walk on a settled process, so the helper waits until its
	// thread count has not changed for 200 ms.
	last, since := -1, time.Now()
	for time.Since(since) < 200*time.Millisecond {
		ds, _ := os.ReadDir("/proc/self/task")
		if len(ds) != last {
			last, since = len(ds), time.Now()
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println(helperReady)
	time.Sleep(time.Hour)
}
