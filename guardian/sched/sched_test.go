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
	pid, forkChild := startForker(t)
	if err := SetRR(pid, 1); err != nil {
		t.Fatal(err)
	}
	a, err := Get(pid)
	if err != nil || !a.IsRR(1) {
		t.Fatalf("Get() = %+v,%v; want SCHED_RR prio 1 reset-on-fork", a, err)
	}
	child := forkChild()
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

// startForker starts a shell that, once told, forks a sleeping child and
// prints its PID. forkChild tells it and returns the child's PID.
func startForker(t *testing.T) (pid int, forkChild func() int) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", "read x; sleep 30 & echo $!; wait")
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd.Process.Pid, func() int {
		t.Helper()
		in.Write([]byte("go\n"))
		buf := make([]byte, 32)
		n, _ := out.Read(buf)
		child, err := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Kill(child, unix.SIGKILL) })
		return child
	}
}

// The nice fallback is set with reset-on-fork: the process runs at the
// fallback nice, the processes it forks afterwards at nice 0.
func TestSetOtherResetsNiceOnFork(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_SYS_NICE) to set a negative nice")
	}
	pid, forkChild := startForker(t)
	if err := SetOther(pid, -20); err != nil {
		t.Fatal(err)
	}
	want := Attr{Policy: unix.SCHED_NORMAL, ResetOnFork: true, Nice: -20}
	if a, err := Get(pid); err != nil || a != want {
		t.Fatalf("Get() = %+v, %v; want %+v", a, err, want)
	}
	child := forkChild()
	if c, err := Get(child); err != nil || c != (Attr{Policy: unix.SCHED_NORMAL}) {
		t.Errorf("child Get() = %+v, %v; want SCHED_NORMAL nice 0 without reset-on-fork", c, err)
	}
}

// SetOther takes a real-time process back to normal scheduling.
func TestSetOtherDemotesRealTime(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_SYS_NICE) to set SCHED_RR")
	}
	pid, _ := startForker(t)
	if err := SetRR(pid, 1); err != nil {
		t.Fatal(err)
	}
	if err := SetOther(pid, 0); err != nil {
		t.Fatal(err)
	}
	want := Attr{Policy: unix.SCHED_NORMAL, ResetOnFork: true}
	if a, err := Get(pid); err != nil || a != want {
		t.Errorf("Get() = %+v, %v; want %+v", a, err, want)
	}
}
