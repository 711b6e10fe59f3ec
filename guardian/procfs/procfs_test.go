package procfs

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"labkeep/guardian/internal/poll"
	"labkeep/guardian/victim"
)

func TestParseStat(t *testing.T) {
	tests := []struct {
		name    string
		stat    string
		want    victim.Process
		exiting bool
	}{
		{
			name: "plain",
			stat: "42 (sshd) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0 12345 1000000 250 18446744073709551615",
			want: victim.Process{Identity: victim.Identity{PID: 42, StartTime: 12345}, PPID: 1, State: "S", Comm: "sshd", CPUTicks: 10, RSS: 250 * 4096},
		},
		{
			name:    "an exiting process (PF_EXITING)",
			stat:    "44 (hog) R 1 44 44 0 -1 4194564 100 0 0 0 7 3 0 0 20 0 1 0 555 1000000 250 0",
			want:    victim.Process{Identity: victim.Identity{PID: 44, StartTime: 555}, PPID: 1, State: "R", Comm: "hog", CPUTicks: 10, RSS: 250 * 4096},
			exiting: true,
		},
		{
			name: "a name with spaces and parentheses cannot shift the fields",
			stat: "43 (x) S 9 (y) R 7 7 7 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 999 0 3 0",
			want: victim.Process{Identity: victim.Identity{PID: 43, StartTime: 999}, PPID: 7, State: "R", Comm: "x) S 9 (y", CPUTicks: 2, RSS: 3 * 4096},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _, err := parseStat(tt.stat, 4096)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got.Process); diff != "" {
				t.Errorf("parseStat() (-want +got):\n%s", diff)
			}
			if got.exiting != tt.exiting {
				t.Errorf("exiting = %v; want %v", got.exiting, tt.exiting)
			}
		})
	}
	for _, bad := range []string{"", "42 sshd S", "42 (sshd) S 1 2"} {
		if _, _, err := parseStat(bad, 4096); err == nil {
			t.Errorf("parseStat(%q) accepted malformed input", bad)
		}
	}
}

func TestProcessReadsRealProcesses(t *testing.T) {
	fs := New("/proc", "")
	// exec -a renames argv[0]; comm follows the executable, so rename comm
	// explicitly through /proc/self/comm.
	cmd := exec.Command("/bin/sh", "-c", "printf sshd > /proc/self/comm; exec /bin/sleep 30")
	cmd2 := exec.Command("/bin/sh", "-c", `echo -n sshd > /proc/$$/comm; while :; do sleep 1; done`)
	for _, c := range []*exec.Cmd{cmd, cmd2} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	}
	self, err := fs.Process(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	if self.Exe != exe || self.StartTime == 0 || self.RSS == 0 || self.PPID != os.Getppid() {
		t.Errorf("Process(self) = %+v; want exe %s", self, exe)
	}
	renamed := waitComm(t, fs, cmd2.Process.Pid, "sshd")
	if renamed.Exe != "/usr/bin/dash" && renamed.Exe != "/usr/bin/bash" && renamed.Exe != "/bin/dash" && renamed.Exe != "/bin/bash" {
		t.Errorf("renamed process exe = %q; the name must not change the executable", renamed.Exe)
	}
	zombie := exec.Command("/bin/true")
	if err := zombie.Start(); err != nil {
		t.Fatal(err)
	}
	// Exited but not reaped yet: a zombie. If it never is, the check below
	// fails.
	poll.Until(time.Second, func() bool {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(zombie.Process.Pid) + "/stat")
		return strings.Contains(string(b), ") Z ")
	})
	if _, err := fs.Process(zombie.Process.Pid); !errors.Is(err, ErrGone) {
		t.Errorf("Process(zombie) error = %v; want ErrGone", err)
	}
	zombie.Wait()
	if _, err := fs.Process(1 << 22); !errors.Is(err, ErrGone) {
		t.Errorf("Process(nonexistent) error = %v; want ErrGone", err)
	}
	snap, err := fs.Snapshot([]int{os.Getpid(), 1 << 22, cmd.Process.Pid})
	if err != nil || len(snap) != 2 {
		t.Errorf("Snapshot() = %d processes, %v; want 2 (the vanished one skipped)", len(snap), err)
	}
	if adj, err := fs.OOMScoreAdj(cmd.Process.Pid); err != nil || adj != 0 {
		t.Errorf("OOMScoreAdj() = %d,%v", adj, err)
	}
	// Raising needs no privilege; lowering below 0 needs CAP_SYS_RESOURCE.
	if err := fs.SetOOMScoreAdj(cmd.Process.Pid, 500); err != nil {
		t.Fatal(err)
	}
	if adj, _ := fs.OOMScoreAdj(cmd.Process.Pid); adj != 500 {
		t.Errorf("oom_score_adj = %d after setting 500", adj)
	}
	err = fs.SetOOMScoreAdj(cmd.Process.Pid, -999)
	if HasCapability(unix.CAP_SYS_RESOURCE) {
		if adj, _ := fs.OOMScoreAdj(cmd.Process.Pid); err != nil || adj != -999 {
			t.Errorf("oom_score_adj = %d,%v after setting -999 with CAP_SYS_RESOURCE", adj, err)
		}
	} else if !errors.Is(err, os.ErrPermission) {
		t.Errorf("SetOOMScoreAdj(-999) without CAP_SYS_RESOURCE = %v; want a permission error", err)
	}
}

func waitComm(t *testing.T, fs *FS, pid int, comm string) victim.Process {
	t.Helper()
	var p victim.Process
	poll.Eventually(t, 3*time.Second, func() (bool, string) {
		var err error
		p, err = fs.Process(pid)
		return err == nil && p.Comm == comm, fmt.Sprintf("process %d never got comm %q (%+v, %v)", pid, comm, p, err)
	})
	return p
}

func TestListenerOwner(t *testing.T) {
	fs := New("/proc", "")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	inodes, err := fs.ListeningInodes(port)
	if err != nil || len(inodes) != 1 {
		t.Fatalf("ListeningInodes(%d) = %v,%v", port, inodes, err)
	}
	pid, ok := fs.SocketOwner([]int{1 << 22, os.Getpid()}, inodes)
	if !ok || pid != os.Getpid() {
		t.Errorf("SocketOwner() = %d,%v; want %d", pid, ok, os.Getpid())
	}
	other, _ := fs.ListeningInodes(port + 1)
	if _, ok := fs.SocketOwner([]int{os.Getpid()}, other); ok && len(other) == 0 {
		t.Error("SocketOwner() found an owner for no inodes")
	}
}
