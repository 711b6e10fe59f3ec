package e2e

import (
	"bufio"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"labkeep/guardian/internal/testcgroup"
	"labkeep/guardian/procfs"
	"labkeep/guardian/sched"
)

// The workspace's root kills sshd and binds the SSH port with its own
// program, which answers the SSH banner and burns a CPU. guardian checks
// the holder's executable against the sshd the workspace started with:
// the program gets no SCHED_RR, no oom_score_adj -1000, an alert names
// it, and POST /cleanup kills it like any user process.
func TestHostileListenerGetsNoProtection(t *testing.T) {
	ws := newWorkspace(t, testcgroup.Limits{MemoryBytes: 256 << 20, Pids: 256, CPUs: 1})
	g := ws.startGuardian(t.TempDir()+"/state.json", nil)
	since := time.Now()
	// Where the runner lacks CAP_SYS_RESOURCE guardian cannot lower
	// oom_score_adj for anyone (it alerts); the check then shows nothing.
	oomCap := procfs.HasCapability(unix.CAP_SYS_RESOURCE)
	var attr sched.Attr
	var adj int
	if !eventually(5*time.Second, func() bool {
		attr, _ = sched.Get(ws.sshd.id.PID)
		adj, _ = ws.fs.OOMScoreAdj(ws.sshd.id.PID)
		return attr.IsRR(1) && (adj == -1000 || !oomCap)
	}) {
		t.Fatalf("the real sshd listener = %+v, oom_score_adj %d; want SCHED_RR 1 and -1000 before the takeover", attr, adj)
	}
	if !oomCap {
		t.Logf("this runner lacks CAP_SYS_RESOURCE: nobody gets oom_score_adj -1000 (sshd has %d), so that check below cannot fail", adj)
	}

	k := ws.user("/bin/kill", "-9", strconv.Itoa(ws.sshd.id.PID))
	<-k.done
	<-ws.sshd.done
	fake := ws.user(bins.workload, "fakesshd", "-addr", ws.sshAddr)
	id := ws.identity(fake.cmd.Process.Pid, bins.workload)
	var banner string
	if !eventually(5*time.Second, func() bool { banner = readBanner(ws.sshAddr); return banner != "" }) {
		t.Fatalf("the fake sshd never answered on %s: %s", ws.sshAddr, fake.stderr.String())
	}
	takenAt := time.Now()
	var a apiAlert
	if !eventually(10*time.Second, func() bool {
		var ok bool
		a, ok = g.hasAlert("listener-not-sshd")
		return ok && strings.Contains(a.Message, strconv.Itoa(id.PID)) && strings.Contains(a.Message, bins.workload)
	}) {
		t.Fatalf("no listener-not-sshd alert naming pid %d (%s) 10s after it took the port: %+v", id.PID, bins.workload, g.alerts())
	}
	t.Logf("port taken (banner %q) → alert in %v: %s", banner, time.Since(takenAt).Round(time.Millisecond), a.Message)
	time.Sleep(2 * time.Second) // two more protector cycles
	// No real-time and no negative nice. The fake busy-loops, so the CPU
	// storm loop may have put it below normal (SCHED_IDLE): that is fine.
	if a, err := sched.Get(id.PID); err != nil || a.Policy == unix.SCHED_RR || a.Policy == unix.SCHED_FIFO || a.Nice < 0 {
		t.Errorf("fake sshd scheduling = %+v, %v; want no real-time and nice >= 0", a, err)
	}
	if adj, err := ws.fs.OOMScoreAdj(id.PID); err != nil || adj == -1000 {
		t.Errorf("fake sshd oom_score_adj = %d, %v; want not -1000", adj, err)
	}
	code, body := g.cleanup(cleanupToken)
	if code != 200 {
		t.Fatalf("cleanup = %d %s", code, body)
	}
	select {
	case <-fake.done:
		if !strings.Contains(body, strconv.Itoa(id.PID)) {
			t.Errorf("the fake sshd died but is not in the cleanup answer %s", body)
		}
	case <-time.After(scaled(5 * time.Second)):
		t.Errorf("the fake sshd (pid %d) survived the cleanup: it was protected; answer %s", id.PID, body)
	}
	if !ws.stillSame(ws.init.id) {
		t.Error("the container init died")
	}
	g.report(since)
}

// With real-time disabled (GUARDIAN_RT_PRIORITY=0) sshd gets the nice
// fallback with reset-on-fork: the listener runs at nice -20, a login
// shell under it at nice 0.
func TestNiceFallbackStaysWithTheListener(t *testing.T) {
	ws := newWorkspace(t, testcgroup.Limits{MemoryBytes: 256 << 20, Pids: 256, CPUs: 1})
	g := ws.startGuardian(t.TempDir()+"/state.json", map[string]string{"GUARDIAN_RT_PRIORITY": "0"})
	want := sched.Attr{Policy: unix.SCHED_NORMAL, ResetOnFork: true, Nice: -20}
	var attr sched.Attr
	if !eventually(5*time.Second, func() bool { attr, _ = sched.Get(ws.sshd.id.PID); return attr == want }) {
		t.Fatalf("sshd listener = %+v; want %+v", attr, want)
	}
	out, err := ws.run("echo $(nice) $(cut -d' ' -f19 /proc/$PPID/stat)", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(out)
	if len(f) != 2 {
		t.Fatalf("login printed %q; want the shell's and its sshd parent's nice", out)
	}
	if f[0] != "0" || f[1] != "0" {
		t.Errorf("login shell nice %s, its sshd parent nice %s; want 0 and 0 (reset on fork from the listener at -20)", f[0], f[1])
	}
	t.Logf("listener %+v; login shell nice %s, its sshd parent nice %s", attr, f[0], f[1])
	if _, ok := g.hasAlert("listener-not-sshd"); ok {
		t.Errorf("the real sshd was taken for an impostor: %+v", g.alerts())
	}
}

// readBanner returns the first line a server at addr sends, "" when none.
func readBanner(addr string) string {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return ""
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(scaled(time.Second)))
	line, _ := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line)
}

// run logs in as root and returns what cmd printed.
func (ws *workspace) run(cmd string, timeout time.Duration) (string, error) {
	c, err := ssh.Dial("tcp", ws.sshAddr, &ssh.ClientConfig{
		User: "root", Auth: []ssh.AuthMethod{ssh.PublicKeys(ws.signer)}, HostKeyCallback: ssh.FixedHostKey(ws.hostKey), Timeout: timeout,
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	s, err := c.NewSession()
	if err != nil {
		return "", err
	}
	defer s.Close()
	out, err := s.Output(cmd)
	return strings.TrimSpace(string(out)), err
}
