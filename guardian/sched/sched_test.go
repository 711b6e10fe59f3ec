package sched

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestSetRRAndResetOnFork(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_SYS_NICE) to set SCHED_RR")
	}
	// The parent gets SCHED_RR; the child it forks afterwards must come back
	// as SCHED_OTHER (reset on fork).
	cmd := exec.Command("/bin/sh", "-c", "read x; sleep 30 & echo $!; wait")
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pid := cmd.Process.Pid
	if err := SetRR(pid, 1); err != nil {
		t.Fatal(err)
	}
	a, err := Get(pid)
	if err != nil || !a.IsRR(1) {
		t.Fatalf("Get() = %+v,%v; want SCHED_RR prio 1 reset-on-fork", a, err)
	}
	in.Write([]byte("go\n"))
	buf := make([]byte, 32)
	n, _ := out.Read(buf)
	child, err := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Kill(child, unix.SIGKILL) })
	c, err := Get(child)
	if err != nil || c.Policy != unix.SCHED_NORMAL {
		t.Errorf("child Get() = %+v,%v; want SCHED_NORMAL", c, err)
	}
	if err := SetNice(child, -20); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if c, _ := Get(child); c.Nice != -20 {
		t.Errorf("nice = %d; want -20", c.Nice)
	}
}
