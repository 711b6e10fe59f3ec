package killer

import (
	"context"
	"errors"
	"os/exec"
	"testing"
	"time"

	"labkeep/guardian/procfs"
)

func start(t *testing.T, script string) (*exec.Cmd, <-chan struct{}) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
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

func TestTerminate(t *testing.T) {
	k, fs := newKiller()
	tests := []struct {
		name       string
		script     string
		grace      time.Duration
		wantKilled bool
		hurry      func() bool
	}{
		{"SIGTERM suffices", "exec sleep 60", 2 * time.Second, false, nil},
		{"SIGTERM ignored: SIGKILL after the grace period", "trap '' TERM; while :; do sleep 1; done", 300 * time.Millisecond, true, nil},
		{"no grace: SIGKILL at once", "trap '' TERM; while :; do sleep 1; done", 0, true, nil},
		{"hurry cuts the grace period short", "trap '' TERM; while :; do sleep 1; done", time.Hour, true, func() bool { return true }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd, done := start(t, tt.script)
			time.Sleep(50 * time.Millisecond) // let the shell install its trap
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
	cmd, done := start(t, "exec sleep 60")
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
	cmd, done := start(t, "exec sleep 60")
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
	cmd, done := start(t, "exec sleep 60")
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
