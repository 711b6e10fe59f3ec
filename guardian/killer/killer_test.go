package killer

import (
	"bufio"
	"context"
	"errors"
	"os/exec"
	"testing"
	"time"

	"labkeep/guardian/procfs"
)

// start runs argv and returns once the process is the program it names
// (exec.Cmd.Start returns after the exec), so its identity is final.
func start(t *testing.T, argv ...string) (*exec.Cmd, <-chan struct{}) {
	t.Helper()
	return run(t, exec.Command(argv[0], argv[1:]...))
}

// startShell runs a shell script that prints "ready" once it is set up
// (traps installed) and returns after that line, so no test depends on how
// fast a loaded machine runs the script.
func startShell(t *testing.T, script string) (*exec.Cmd, <-chan struct{}) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c, done := run(t, cmd)
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("script %q printed %q, %v; want ready", script, line, err)
	}
	return c, done
}

func run(t *testing.T, cmd *exec.Cmd) (*exec.Cmd, <-chan struct{}) {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	return cmd, done
}

func newKiller() (*Killer, *procfs.FS) {
	fs := procfs.New("/proc", "")
	return &Killer{Procs: fs, Gone: func(err error) bool { return errors.Is(err, procfs.ErrGone) }}, fs
}

// ignoreTerm is a shell that ignores SIGTERM, and says so once it does.
const ignoreTerm = "trap '' TERM; echo ready; while :; do sleep 1; done"

func TestTerminate(t *testing.T) {
	k, fs := newKiller()
	tests := []struct {
		name       string
		script     string
		grace      time.Duration
		wantKilled bool
		hurry      func() bool
	}{
		{"SIGTERM suffices", "trap - TERM; echo ready; while :; do sleep 1; done", 2 * time.Second, false, nil},
		{"SIGTERM ignored: SIGKILL after the grace period", ignoreTerm, 300 * time.Millisecond, true, nil},
		{"no grace: SIGKILL at once", ignoreTerm, 0, true, nil},
		{"hurry cuts the grace period short", ignoreTerm, time.Hour, true, func() bool { return true }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd, done := startShell(t, tt.script)
			id, err := fs.Identity(cmd.Process.Pid)
			if err != nil {
				t.Fatal(err)
			}
			killed, err := k.Terminate(context.Background(), id, Plan{Grace: tt.grace, KillWait: 5 * time.Second, Hurry: tt.hurry})
			if err != nil || killed != tt.wantKilled {
				t.Fatalf("Terminate() = %v,%v; want %v,nil", killed, err, tt.wantKilled)
			}
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("process still running after Terminate returned")
			}
		})
	}
}

func TestIdentityMismatchSparesTheProcess(t *testing.T) {
	k, fs := newKiller()
	cmd, done := start(t, "sleep", "60")
	id, err := fs.Identity(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(){
		"start time (PID reused)": func() { id.StartTime++ },
		"executable":              func() { id.Exe = "/usr/sbin/sshd" },
		"cgroup":                  func() { id.Cgroup = "/elsewhere" },
	} {
		stale := id
		orig := id
		mutate()
		stale, id = id, orig
		if err := k.Signal(stale, 9); !errors.Is(err, ErrIdentityChanged) {
			t.Errorf("%s changed: Signal() error = %v; want ErrIdentityChanged", name, err)
		}
		if _, err := k.Terminate(context.Background(), stale, Plan{KillWait: time.Second}); !errors.Is(err, ErrIdentityChanged) {
			t.Errorf("%s changed: Terminate() error = %v; want ErrIdentityChanged", name, err)
		}
	}
	select {
	case <-done:
		t.Fatal("a process with a different identity was killed")
	case <-time.After(100 * time.Millisecond):
	}
}

// The first signal can go out while the caller holds the process still
// (frozen cgroup); AfterFirstSignal runs right after it, before the wait.
func TestAfterFirstSignal(t *testing.T) {
	k, fs := newKiller()
	cmd, done := start(t, "sleep", "60")
	id, err := fs.Identity(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	if _, err := k.Terminate(context.Background(), id, Plan{Grace: time.Second, KillWait: time.Second, AfterFirstSignal: func() { ran = true }}); err != nil {
		t.Fatal(err)
	}
	<-done
	if !ran {
		t.Error("AfterFirstSignal did not run")
	}
	ran = false
	if _, err := k.Terminate(context.Background(), id, Plan{AfterFirstSignal: func() { ran = true }}); !errors.Is(err, ErrGone) || !ran {
		t.Errorf("Terminate(gone) = %v, AfterFirstSignal ran %v; want ErrGone and true (the caller must always thaw)", err, ran)
	}
}

func TestGone(t *testing.T) {
	k, fs := newKiller()
	cmd, done := start(t, "sleep", "60")
	id, err := fs.Identity(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Process.Kill()
	<-done
	if err := k.Signal(id, 9); !errors.Is(err, ErrGone) {
		t.Errorf("Signal(dead) error = %v; want ErrGone", err)
	}
}
