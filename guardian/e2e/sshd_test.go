package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"labkeep/guardian/internal/testcgroup"
	"labkeep/guardian/procfs"
)

// When the user kills sshd, guardian alerts within one prober period.
func TestUserKillsSSHDRaisesAlert(t *testing.T) {
	ws := newWorkspace(t, testcgroup.Limits{MemoryBytes: 256 << 20, Pids: 256, CPUs: 1})
	const probe = time.Second
	g := ws.startGuardian(t.TempDir()+"/state.json", map[string]string{"GUARDIAN_PROBE_EVERY": probe.String(), "GUARDIAN_PROTECT_EVERY": "30s"})
	since := time.Now()
	if _, ok := g.hasAlert("ssh-unreachable"); ok {
		t.Fatal("ssh-unreachable raised while sshd runs")
	}
	killedAt := time.Now()
	k := ws.user("/bin/kill", "-9", strconv.Itoa(ws.sshd.id.PID))
	<-k.done
	if !k.state.Success() {
		t.Fatalf("the user could not kill sshd: %v %s", k.state, k.stderr.String())
	}
	var delay time.Duration
	if !eventually(10*time.Second, func() bool {
		_, ok := g.hasAlert("ssh-unreachable")
		delay = time.Since(killedAt)
		return ok
	}) {
		t.Fatalf("no ssh-unreachable alert 10s after sshd was killed: %v", g.alerts())
	}
	t.Logf("sshd killed → alert in %v (prober period %v)", delay.Round(time.Millisecond), probe)
	if !ws.stillSame(ws.init.id) {
		t.Error("the container init died")
	}
	g.report(since)
}

// User processes renamed "sshd" or "guardian" — and even the
// real sshd binary started by the user on another port — get no
// protection; POST /cleanup kills them while the real listener and init
// stay.
func TestRenamedProcessesGetNoProtection(t *testing.T) {
	ws := newWorkspace(t, testcgroup.Limits{MemoryBytes: 512 << 20, Pids: 256, CPUs: 1})
	g := ws.startGuardian(t.TempDir()+"/state.json", nil)
	since := time.Now()

	fakeSSHD := ws.user(bins.workload, "idle", "-comm", "sshd", "-mb", "20")
	fakeGuardian := ws.user(bins.workload, "idle", "-comm", "guardian", "-mb", "20")
	cfg2 := filepath.Join(ws.dir, "sshd_config_user")
	conf := fmt.Sprintf("Port %d\nListenAddress 127.0.0.1\nHostKey %s\nPidFile %s\nUsePAM no\n", freePort(t), filepath.Join(ws.dir, "host_ed25519"), filepath.Join(ws.dir, "user-sshd.pid"))
	if err := os.WriteFile(cfg2, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	userSSHD := ws.user("/usr/sbin/sshd", "-D", "-e", "-f", cfg2)
	for _, p := range []*proc{fakeSSHD, fakeGuardian} {
		if !eventually(5*time.Second, func() bool {
			x, err := ws.fs.Process(p.cmd.Process.Pid)
			return err == nil && x.Exe == bins.workload && (x.Comm == "sshd" || x.Comm == "guardian")
		}) {
			t.Fatalf("never renamed itself: %s", p.describe())
		}
	}
	ws.identity(userSSHD.cmd.Process.Pid, "/usr/sbin/sshd")
	time.Sleep(1500 * time.Millisecond) // a protector cycle

	if code, body := g.cleanup(""); code != 401 {
		t.Errorf("cleanup without token = %d %s; want 401", code, body)
	}
	if code, body := g.cleanup("wrong"); code != 401 {
		t.Errorf("cleanup with a wrong token = %d %s; want 401", code, body)
	}
	for _, p := range []*proc{fakeSSHD, fakeGuardian, userSSHD} {
		if !p.alive() {
			t.Fatalf("pid %d died although no authorised cleanup happened", p.cmd.Process.Pid)
		}
	}
	code, body := g.cleanup(cleanupToken)
	if code != 200 {
		t.Fatalf("cleanup = %d %s", code, body)
	}
	for name, p := range map[string]*proc{"renamed sshd": fakeSSHD, "renamed guardian": fakeGuardian, "user-started sshd on another port": userSSHD} {
		select {
		case <-p.done:
			if !strings.Contains(body, strconv.Itoa(p.cmd.Process.Pid)) {
				t.Errorf("%s (pid %d) died but is not in the cleanup answer %s", name, p.cmd.Process.Pid, body)
			}
		case <-time.After(scaled(5 * time.Second)):
			t.Errorf("%s (pid %d) survived the cleanup: it was protected", name, p.cmd.Process.Pid)
		}
	}
	if !ws.stillSame(ws.sshd.id) || !ws.stillSame(ws.init.id) {
		t.Errorf("cleanup killed a protected process: sshd alive %v, init alive %v", ws.stillSame(ws.sshd.id), ws.stillSame(ws.init.id))
	}
	if _, err := ws.login(5 * time.Second); err != nil {
		t.Errorf("login after cleanup: %v", err)
	}
	fs := procfs.New("/proc", "")
	adj, _ := fs.OOMScoreAdj(ws.sshd.id.PID)
	if procfs.HasCapability(unix.CAP_SYS_RESOURCE) {
		if adj != -1000 {
			t.Errorf("sshd oom_score_adj = %d; want -1000", adj)
		}
	} else if _, ok := g.hasAlert("oom-protection-unavailable"); !ok {
		t.Errorf("without CAP_SYS_RESOURCE guardian must say it cannot set oom_score_adj (sshd has %d)", adj)
	} else {
		t.Logf("this runner lacks CAP_SYS_RESOURCE: guardian alerted that oom_score_adj -1000 is unavailable (sshd keeps %d)", adj)
	}
	t.Logf("cleanup answer: %s", body)
	g.report(since)
}
