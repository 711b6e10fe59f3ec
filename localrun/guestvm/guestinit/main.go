// Command guestinit is PID 1 of a test VM built by package guestvm. It
// mounts /proc, /sys, /dev, a tmpfs on /tmp and /run, and the cgroup v2
// hierarchy at /sys/fs/cgroup with every available controller enabled for
// its children; it loads the kernel modules /guest/modules.order lists and
// brings up loopback, runs the command written in
// /guest/cmd (one argument per line) with the environment in /guest/env
// (KEY=value per line) on the serial console, prints the exit marker the
// host waits for and powers the machine off.
//
// It never returns: PID 1 exiting would panic the kernel, and a VM that
// does not power off would leave the host waiting for its timeout.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"labkeep/localrun/guestvm"
	"labkeep/localrun/loopback"
)

func main() {
	code := run()
	fmt.Printf("\n%s%d\n", guestvm.ExitMarker, code)
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	select {}
}

func run() int {
	if err := setup(); err != nil {
		fmt.Fprintf(os.Stderr, "guestinit: %v\n", err)
		return 125
	}
	args, err := lines("/guest/cmd")
	if err != nil || len(args) == 0 {
		fmt.Fprintf(os.Stderr, "guestinit: no command in /guest/cmd: %v\n", err)
		return 125
	}
	env, _ := lines("/guest/env")
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append([]string{"PATH=/usr/bin:/usr/sbin:/bin:/sbin", "HOME=/root", "TMPDIR=/tmp"}, env...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
	cmd.Dir = "/"
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "guestinit: start %v: %v\n", args, err)
		return 126
	}
	// As PID 1, reap every orphan (killed fork bombs, daemonised
	// children) while waiting for the command itself.
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if err != nil {
			return 127
		}
		if pid == cmd.Process.Pid {
			if ws.Signaled() {
				return 128 + int(ws.Signal())
			}
			return ws.ExitStatus()
		}
	}
}

// setup mounts the filesystems and brings up loopback.
func setup() error {
	mounts := []struct {
		src, target, fstype, data string
	}{
		{"devtmpfs", "/dev", "devtmpfs", ""},
		{"proc", "/proc", "proc", ""},
		{"sysfs", "/sys", "sysfs", ""},
		{"cgroup2", "/sys/fs/cgroup", "cgroup2", ""},
		{"tmpfs", "/tmp", "tmpfs", "mode=1777"},
		{"tmpfs", "/run", "tmpfs", "mode=755"},
	}
	for _, m := range mounts {
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.src, m.target, m.fstype, 0, m.data); err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.target, err)
		}
	}
	// The console the kernel gave PID 1 may be missing when /dev was
	// empty at boot: use the serial port from here on.
	if tty, err := os.OpenFile("/dev/ttyS0", os.O_RDWR, 0); err == nil {
		for _, fd := range []int{1, 2} {
			_ = unix.Dup2(int(tty.Fd()), fd)
		}
	}
	ctrl, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
	if err != nil {
		return err
	}
	var enable []string
	for _, c := range strings.Fields(string(ctrl)) {
		enable = append(enable, "+"+c)
	}
	if err := os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte(strings.Join(enable, " ")), 0); err != nil {
		return fmt.Errorf("enable controllers %v: %w", enable, err)
	}
	if err := loadModules(); err != nil {
		return err
	}
	return loopback.Up()
}

// loadModules loads the kernel modules /guest/modules.order names, in
// that order (each one's dependencies come before it).
func loadModules() error {
	mods, err := lines("/guest/modules.order")
	if err != nil {
		return nil // none asked for
	}
	for _, m := range mods {
		f, err := os.Open(m)
		if err != nil {
			return err
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("load module %s: %w", m, err)
		}
	}
	return nil
}

func lines(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out, nil
}
