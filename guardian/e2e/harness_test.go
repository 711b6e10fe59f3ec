// Package e2e runs guardian end to end on the real kernel: a real cgroup
// stands in for the workspace container (memory, pids, freezer, CPU quota
// set before anything runs in it), a real OpenSSH sshd runs inside it
// without the capabilities a Pod's root lacks, the guardian binary is built
// and run against it with the Pod's capability set, and an SSH client keeps
// logging in while the user misbehaves.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"labkeep/guardian/internal/poll"
	"labkeep/guardian/internal/testcgroup"
	"labkeep/guardian/procfs"
	"labkeep/guardian/victim"
)

// Capabilities: the workspace's root lacks these (as in a Pod), guardian
// has exactly the Pod's sidecar set.
const (
	userDrop     = "-sys_admin,-sys_nice,-sys_resource"
	cleanupToken = "e2e-cleanup-token"
)

// guardianCaps is the Pod's sidecar set (SYS_PTRACE, SYS_NICE, KILL,
// SYS_RESOURCE), less SYS_RESOURCE where the test runner itself lacks it
// (then guardian reports that it cannot lower oom_score_adj).
func guardianCaps() string {
	caps := "-all,+sys_ptrace,+sys_nice,+kill"
	if procfs.HasCapability(unix.CAP_SYS_RESOURCE) {
		caps += ",+sys_resource"
	}
	return caps
}

var bins struct {
	guardian, workload string
	built              bool // in a temporary directory this test binary removes
	err                error
	once               sync.Once
}

// TimeScaleEnv stretches every wait and timeout of the scenarios by a
// factor (default 1). The cgroup v2 VM runs under software emulation,
// several times slower than its host, and sets it: what the scenarios
// assert stays the same, only the time allowed grows.
const TimeScaleEnv = "GUARDIAN_E2E_TIME_SCALE"

var timeScale = func() float64 {
	f, err := strconv.ParseFloat(os.Getenv(TimeScaleEnv), 64)
	if err != nil || f < 1 {
		return 1
	}
	return f
}()

// emulated reports whether the scenarios run on an emulated CPU (a time
// scale above 1): the few scenario sizes that only measure emulation
// speed there are made smaller.
func emulated() bool { return timeScale > 1 }

// scaled is d stretched by the time scale.
func scaled(d time.Duration) time.Duration { return time.Duration(float64(d) * timeScale) }

// BinDirEnv names a directory holding prebuilt guardian and workload
// binaries. The cgroup v2 VM, which has no Go toolchain, runs this test
// binary with it set.
const BinDirEnv = "GUARDIAN_E2E_BIN_DIR"

// build compiles guardian and the workload tool once per test binary, or
// takes them from $GUARDIAN_E2E_BIN_DIR.
func build(t testing.TB) {
	t.Helper()
	bins.once.Do(func() {
		if dir := os.Getenv(BinDirEnv); dir != "" {
			bins.guardian, bins.workload = filepath.Join(dir, "guardian"), filepath.Join(dir, "workload")
			return
		}
		dir, err := os.MkdirTemp("", "guardian-e2e-bin-")
		if err != nil {
			bins.err = err
			return
		}
		for name, pkg := range map[string]string{"guardian": "labkeep/guardian/cmd/guardian", "workload": "labkeep/guardian/internal/workload"} {
			out := filepath.Join(dir, name)
			cmd := exec.Command("go", "build", "-o", out, pkg)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if raceEnabled && name == "guardian" {
				cmd = exec.Command("go", "build", "-race", "-o", out, pkg)
				cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
			}
			if b, err := cmd.CombinedOutput(); err != nil {
				bins.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
				return
			}
		}
		bins.guardian, bins.workload, bins.built = filepath.Join(dir, "guardian"), filepath.Join(dir, "workload"), true
	})
	if bins.err != nil {
		t.Fatal(bins.err)
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if bins.built {
		os.RemoveAll(filepath.Dir(bins.guardian))
	}
	os.Exit(code)
}

// requireEnv skips unless the machine can run the end-to-end tests.
func requireEnv(t testing.TB) {
	t.Helper()
	testcgroup.RequireRoot(t)
	for _, bin := range []string{"/usr/sbin/sshd", "/usr/bin/ssh-keygen", "/usr/bin/setpriv"} {
		if _, err := os.Stat(bin); err != nil {
			t.Skipf("needs %s (apt-get install openssh-server util-linux): %v", bin, err)
		}
	}
	build(t)
}

// workspace is a cgroup with an init process and a real sshd in it.
type workspace struct {
	t       testing.TB
	rel     string
	lim     testcgroup.Limits
	dir     string
	sshAddr string
	signer  ssh.Signer
	hostKey ssh.PublicKey
	init    *proc
	sshd    *proc
	fs      *procfs.FS

	passwd, sshdConfig string // the workspace's /etc/passwd and sshd_config
}

// proc is a process started by the harness, reaped in the background.
type proc struct {
	cmd    *exec.Cmd
	done   chan struct{}
	state  *os.ProcessState
	ended  time.Time
	id     victim.Identity
	stderr *syncBuffer
}

func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// describe says what the kernel shows of the process, for a failure
// message: ended (and how) or its state, name, executable and where it
// sleeps in the kernel, and what it wrote to stderr.
func (p *proc) describe() string {
	var b strings.Builder
	pid := p.cmd.Process.Pid
	if !p.alive() {
		fmt.Fprintf(&b, "pid %d ended (%v)", pid, p.state)
	} else {
		fmt.Fprintf(&b, "pid %d alive", pid)
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		wchan, _ := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", pid))
		fmt.Fprintf(&b, ", exe %q, wchan %q", exe, wchan)
		if status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
			for _, line := range strings.Split(string(status), "\n") {
				if k, _, _ := strings.Cut(line, ":"); k == "Name" || k == "State" || k == "voluntary_ctxt_switches" || k == "nonvoluntary_ctxt_switches" {
					fmt.Fprintf(&b, ", %s", strings.Join(strings.Fields(line), " "))
				}
			}
		}
		if sched, err := os.ReadFile(fmt.Sprintf("/proc/%d/sched", pid)); err == nil {
			for _, line := range strings.Split(string(sched), "\n") {
				if k, _, _ := strings.Cut(line, ":"); strings.TrimSpace(k) == "policy" || strings.TrimSpace(k) == "se.sum_exec_runtime" {
					fmt.Fprintf(&b, ", %s", strings.Join(strings.Fields(line), " "))
				}
			}
		}
	}
	fmt.Fprintf(&b, "; stderr %q", p.stderr.String())
	return b.String()
}

// killedBySignal reports whether the process ended by a signal.
func (p *proc) killedBySignal() (syscall.Signal, bool) {
	<-p.done
	ws, ok := p.state.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		return 0, false
	}
	return ws.Signal(), true
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newWorkspace(t testing.TB, lim testcgroup.Limits) *workspace {
	t.Helper()
	requireEnv(t)
	ws := newSSHConfig(t, lim)
	ws.rel = testcgroup.New(t, lim)
	// The container's entrypoint comes first, so it is the oldest process.
	ws.init = ws.user("/bin/sleep", "infinity")
	ws.sshd = start(t, testcgroup.Command(ws.rel, ws.sshdArgs()[0], ws.sshdArgs()[1:]...))
	ws.waitSSH()
	ws.sshd.id = ws.identity(ws.sshd.cmd.Process.Pid, "/usr/sbin/sshd")
	ws.init.id = ws.identity(ws.init.cmd.Process.Pid, "/usr/bin/sleep")
	for _, c := range []int{unix.CAP_SYS_ADMIN, unix.CAP_SYS_NICE, unix.CAP_SYS_RESOURCE} {
		if procfs.ProcessHasCapability("/proc", ws.sshd.id.PID, c) {
			t.Fatalf("the workspace's sshd still has capability %d; it must run without what a Pod's root lacks", c)
		}
	}
	return ws
}

// sshdArgs is the command line that runs the workspace's sshd as a
// container would: in its own mount namespace with the workspace's
// /etc/passwd, without the capabilities a Pod's root lacks.
func (ws *workspace) sshdArgs() []string {
	return []string{"/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
		`mount --bind "$0" /etc/passwd && exec /usr/bin/setpriv --bounding-set ` + userDrop + ` -- /usr/sbin/sshd -D -e -f "$1"`,
		ws.passwd, ws.sshdConfig}
}

// newSSHConfig prepares what the workspace's sshd needs (host key, client
// key, configuration on a free port, an /etc/passwd whose root has a fresh
// home) without starting anything.
func newSSHConfig(t testing.TB, lim testcgroup.Limits) *workspace {
	t.Helper()
	ws := &workspace{t: t, lim: lim, dir: t.TempDir(), fs: procfs.New("/proc", "memory")}
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		t.Fatal(err)
	}
	hostKey := filepath.Join(ws.dir, "host_ed25519")
	if b, err := exec.Command("/usr/bin/ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", hostKey).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, b)
	}
	pubBytes, _ := os.ReadFile(hostKey + ".pub")
	var err error
	ws.hostKey, _, _, _, err = ssh.ParseAuthorizedKey(pubBytes)
	if err != nil {
		t.Fatal(err)
	}
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	ws.signer, err = ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	auth := filepath.Join(ws.dir, "authorized_keys")
	if err := os.WriteFile(auth, ssh.MarshalAuthorizedKey(ws.signer.PublicKey()), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	ws.sshAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cfg := filepath.Join(ws.dir, "sshd_config")
	conf := fmt.Sprintf(`Port %d
ListenAddress 127.0.0.1
HostKey %s
PidFile %s/sshd.pid
AuthorizedKeysFile %s
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxStartups 100
LogLevel ERROR
`, port, hostKey, ws.dir, auth)
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	// Like a container, the workspace has its own /etc/passwd: root's home
	// is a fresh directory, so logins never run the host root's shell
	// start-up files (which could hang or leave locks behind when a test
	// kills a login).
	home := filepath.Join(ws.dir, "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	hostPasswd, err := os.ReadFile("/etc/passwd")
	if err != nil {
		t.Fatal(err)
	}
	entries := []string{"root:x:0:0:root:" + home + ":/bin/bash"}
	for _, line := range strings.Split(strings.TrimSpace(string(hostPasswd)), "\n") {
		if !strings.HasPrefix(line, "root:") {
			entries = append(entries, line)
		}
	}
	passwd := filepath.Join(ws.dir, "passwd")
	if err := os.WriteFile(passwd, []byte(strings.Join(entries, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ws.passwd, ws.sshdConfig = passwd, cfg
	return ws
}

// user starts a process inside the workspace cgroup as the workspace's root:
// without CAP_SYS_ADMIN, CAP_SYS_NICE and CAP_SYS_RESOURCE.
func (ws *workspace) user(name string, args ...string) *proc {
	ws.t.Helper()
	cmd := testcgroup.Command(ws.rel, "/usr/bin/setpriv", append([]string{"--bounding-set", userDrop, "--", name}, args...)...)
	return start(ws.t, cmd)
}

func start(t testing.TB, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{cmd: cmd, done: make(chan struct{}), stderr: &syncBuffer{}}
	cmd.Stderr = p.stderr
	// A process that entered another PID namespace (nsenter) leaves
	// descendants holding stderr after it is killed; Wait must not wait
	// for them.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", cmd.Args, err)
	}
	go func() {
		cmd.Wait()
		p.state = cmd.ProcessState
		p.ended = time.Now()
		close(p.done)
	}()
	t.Cleanup(func() {
		if p.alive() {
			cmd.Process.Kill()
		}
		<-p.done
	})
	return p
}

// identity waits until pid has exec'd exe and returns its identity.
func (ws *workspace) identity(pid int, exe string) victim.Identity {
	ws.t.Helper()
	var id victim.Identity
	if !eventually(10*time.Second, func() bool {
		p, err := ws.fs.Process(pid)
		id = p.Identity
		return err == nil && p.Exe == exe
	}) {
		ws.t.Fatalf("pid %d never became %s", pid, exe)
	}
	return id
}

// stillSame reports whether the process with this identity is alive.
func (ws *workspace) stillSame(id victim.Identity) bool {
	cur, err := ws.fs.Identity(id.PID)
	return err == nil && cur == id
}

func (ws *workspace) waitSSH() {
	ws.t.Helper()
	if eventually(15*time.Second, func() bool { _, err := ws.login(2 * time.Second); return err == nil }) {
		return
	}
	_, err := ws.login(2 * time.Second)
	ws.t.Fatalf("sshd never accepted a login: %v\nsshd stderr: %s", err, ws.sshd.stderr.String())
}

// login opens an SSH connection as root, runs a command and checks its
// output. It returns how long the whole login took.
func (ws *workspace) login(timeout time.Duration) (time.Duration, error) {
	timeout = scaled(timeout)
	start := time.Now()
	conn, err := net.DialTimeout("tcp", ws.sshAddr, timeout)
	if err != nil {
		return time.Since(start), err
	}
	defer conn.Close()
	conn.SetDeadline(start.Add(timeout))
	c, chans, reqs, err := ssh.NewClientConn(conn, ws.sshAddr, &ssh.ClientConfig{
		User: "root", Auth: []ssh.AuthMethod{ssh.PublicKeys(ws.signer)}, HostKeyCallback: ssh.FixedHostKey(ws.hostKey),
	})
	if err != nil {
		return time.Since(start), err
	}
	client := ssh.NewClient(c, chans, reqs)
	defer client.Close()
	s, err := client.NewSession()
	if err != nil {
		return time.Since(start), err
	}
	defer s.Close()
	out, err := s.Output("echo alive")
	if err != nil {
		return time.Since(start), err
	}
	if strings.TrimSpace(string(out)) != "alive" {
		return time.Since(start), fmt.Errorf("login command printed %q", out)
	}
	return time.Since(start), nil
}

// logins is the record of a login loop.
type logins struct {
	mu        sync.Mutex
	latencies []time.Duration
	failures  []string
	stop      context.CancelFunc
	done      chan struct{}
}

// loginLoop logs in every `every` until stopped.
func (ws *workspace) loginLoop(every, timeout time.Duration) *logins {
	ctx, cancel := context.WithCancel(context.Background())
	l := &logins{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for ctx.Err() == nil {
			took, err := ws.login(timeout)
			l.mu.Lock()
			if err != nil {
				l.failures = append(l.failures, fmt.Sprintf("%s after %v: %v", time.Now().Format("15:04:05.000"), took.Round(time.Millisecond), err))
			} else {
				l.latencies = append(l.latencies, took)
			}
			l.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(every):
			}
		}
	}()
	ws.t.Cleanup(func() { cancel(); <-l.done })
	return l
}

// finish stops the loop and returns successes and failures.
func (l *logins) finish() ([]time.Duration, []string) {
	l.stop()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]time.Duration(nil), l.latencies...), append([]string(nil), l.failures...)
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p * float64(len(s)-1))
	return s[i].Round(time.Millisecond)
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// guardian is a running guardian binary.
type guardian struct {
	t     testing.TB
	p     *proc
	api   string
	logs  *syncBuffer
	state string
	env   []string
	// wrap places guardian's command line (setpriv … guardian) where it
	// runs, e.g. in a Pod's cgroup and namespaces; nil: as it is.
	wrap func(args []string) *exec.Cmd
	// started is the API path that answers 200 once guardian counts as
	// started: /healthz when the workspace exists from the start, /livez
	// when guardian starts first.
	started string
}

// fastEnv scales guardian's periods down so each scenario takes seconds.
// The probe's bound (5 s in production) is scaled less than the periods:
// under a CPU storm that guardian has already tamed, a login on this 2-core
// machine takes about 1 s (the cgroup's quota is spent by the demoted
// spinners, so sshd waits for the next CFS period at each wake-up), and a
// 1 s bound there called a working SSH unreachable now and then, which the
// compressed hang escalation turned into kills. A stopped sshd still never
// answers within it.
func fastEnv() map[string]string {
	return map[string]string{
		"GUARDIAN_PROTECT_EVERY": "1s", "GUARDIAN_PROBE_EVERY": "1s", "GUARDIAN_PROBE_TIMEOUT": scaled(2 * time.Second).String(),
		"GUARDIAN_CPU_EVERY": "500ms", "GUARDIAN_MEMORY_POLL": "500ms", "GUARDIAN_FORK_SCAN": "250ms",
		"GUARDIAN_KILL_GRACE": "1s", "GUARDIAN_KILL_WAIT": "5s",
		"GUARDIAN_HANG_ALERT_AFTER": "2s", "GUARDIAN_HANG_KILL_ONE_AFTER": "4s", "GUARDIAN_HANG_KILL_THREE_AFTER": "6s", "GUARDIAN_HANG_KILL_ALL_AFTER": "8s", "GUARDIAN_HANG_RECOVERY": "3s",
		"GUARDIAN_ALERT_WINDOW": "10s",
	}
}

// startGuardian runs guardian against the workspace with the Pod's
// sidecar capabilities. extra overrides fastEnv; a nil value removes a key.
func (ws *workspace) startGuardian(state string, extra map[string]string) *guardian {
	ws.t.Helper()
	env := fastEnv()
	env["GUARDIAN_CGROUP"] = ws.rel
	env["GUARDIAN_SSH_ADDR"] = ws.sshAddr
	env["GUARDIAN_LISTEN"] = net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(ws.t)))
	env["GUARDIAN_STATE_PATH"] = state
	env["GUARDIAN_CLEANUP_TOKEN"] = cleanupToken
	env["GUARDIAN_MEMORY_LIMIT"] = strconv.FormatUint(ws.lim.MemoryBytes, 10)
	env["GUARDIAN_PIDS_MAX"] = strconv.Itoa(ws.lim.Pids)
	for k, v := range extra {
		if v == "" {
			delete(env, k)
		} else {
			env[k] = v
		}
	}
	g := &guardian{t: ws.t, api: "http://" + env["GUARDIAN_LISTEN"], state: state, env: envList(env), started: "/healthz"}
	g.start()
	return g
}

// envList turns an environment map into KEY=value entries, sorted.
func envList(env map[string]string) []string {
	var list []string
	for k, v := range env {
		list = append(list, k+"="+v)
	}
	sort.Strings(list)
	return list
}

func (g *guardian) start() {
	g.t.Helper()
	caps := guardianCaps()
	args := []string{"/usr/bin/setpriv", "--bounding-set", caps, "--inh-caps", caps, "--ambient-caps", caps, "--", bins.guardian}
	cmd := exec.Command(args[0], args[1:]...)
	if g.wrap != nil {
		cmd = g.wrap(args)
	}
	cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, g.env...)
	g.p = start(g.t, cmd)
	g.logs = g.p.stderr
	g.t.Cleanup(func() {
		if g.p.alive() {
			g.p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-g.p.done:
			case <-time.After(scaled(5 * time.Second)):
				g.p.cmd.Process.Kill()
			}
		}
		if strings.Contains(g.logs.String(), "WARNING: DATA RACE") {
			g.t.Errorf("the race detector found a data race in guardian")
		}
		if g.t.Failed() {
			g.t.Logf("guardian log:\n%s", g.logs.String())
		}
	})
	if eventually(20*time.Second, func() bool {
		if !g.p.alive() {
			g.t.Fatalf("guardian exited at start: %v\n%s", g.p.state, g.logs.String())
		}
		return g.status(g.started) == 200
	}) {
		return
	}
	g.t.Fatalf("guardian never answered %s with 200\n%s", g.started, g.logs.String())
}

// status returns the HTTP status of GET path on guardian's API, 0 when it
// does not answer.
func (g *guardian) status(path string) int {
	resp, err := http.Get(g.api + path)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// kill SIGKILLs guardian, as a user or the OOM killer might.
func (g *guardian) kill() {
	g.p.cmd.Process.Kill()
	<-g.p.done
}

// records returns guardian's JSON log records with this message.
func (g *guardian) records(msg string) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(g.logs.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r map[string]any
		if json.Unmarshal(sc.Bytes(), &r) == nil && r["msg"] == msg {
			out = append(out, r)
		}
	}
	return out
}

type apiAlert struct {
	Kind, Message string
	Count         int
	First         time.Time
}

func (g *guardian) alerts() []apiAlert {
	g.t.Helper()
	resp, err := http.Get(g.api + "/alerts")
	if err != nil {
		g.t.Fatalf("GET /alerts: %v", err)
	}
	defer resp.Body.Close()
	var body struct{ Alerts []apiAlert }
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		g.t.Fatalf("decode /alerts: %v", err)
	}
	return body.Alerts
}

func (g *guardian) hasAlert(kind string) (apiAlert, bool) {
	for _, a := range g.alerts() {
		if a.Kind == kind {
			return a, true
		}
	}
	return apiAlert{}, false
}

func (g *guardian) cleanup(token string) (int, string) {
	g.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, g.api+"/cleanup", nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatalf("POST /cleanup: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// usage reports guardian's own CPU time and peak RSS so far.
func (g *guardian) usage() (cpu time.Duration, rss, peak uint64) {
	pid := g.p.cmd.Process.Pid
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		ut, _ := strconv.ParseUint(f[11], 10, 64)
		st, _ := strconv.ParseUint(f[12], 10, 64)
		cpu = time.Duration(ut+st) * time.Second / 100 // USER_HZ
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == "VmRSS:" {
				rss, _ = strconv.ParseUint(f[1], 10, 64)
			}
			if len(f) >= 2 && f[0] == "VmHWM:" {
				peak, _ = strconv.ParseUint(f[1], 10, 64)
			}
		}
	}
	return cpu, rss << 10, peak << 10
}

// report logs guardian's resource use over its life.
func (g *guardian) report(since time.Time) {
	cpu, rss, peak := g.usage()
	wall := time.Since(since)
	note := ""
	if raceEnabled {
		note = " (race detector on: inflated)"
	}
	g.t.Logf("guardian resources%s: CPU %v over %v wall (%.1f%% of one core), RSS %.1f MiB, peak RSS %.1f MiB",
		note, cpu, wall.Round(time.Millisecond), 100*cpu.Seconds()/wall.Seconds(), float64(rss)/(1<<20), float64(peak)/(1<<20))
}

func readKnob(t testing.TB, rel, controller, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testcgroup.Dir(rel, controller), knobFile(t, name)))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// v2Knobs maps the v1 files the scenarios read to the cgroup v2 file that
// holds the same fact. The v1 OOM switch and the real-time budget have no
// v2 file: a scenario checks its v2 counterpart itself (see onV2).
var v2Knobs = map[string]string{
	"memory.limit_in_bytes":      "memory.max",
	"memory.usage_in_bytes":      "memory.current",
	"memory.soft_limit_in_bytes": "memory.high", // guardian's throttling threshold on each
	"memory.oom_control":         "memory.events",
}

// knobFile is the file to read for a knob name on this machine: a v1 name
// is translated on v2; a v2 name is read as it is.
func knobFile(t testing.TB, name string) string {
	t.Helper()
	if !onV2() {
		return name
	}
	if v, ok := v2Knobs[name]; ok {
		return v
	}
	if v1Only[name] {
		t.Fatalf("%s has no cgroup v2 equivalent: check its v2 counterpart on v2", name)
	}
	return name
}

// v1Only are the v1 files the scenarios read that have no v2 file.
var v1Only = map[string]bool{"cpu.rt_runtime_us": true, "freezer.state": true, "memory.memsw.limit_in_bytes": true}

// onV2 reports whether the scenarios run on a cgroup v2-only kernel.
func onV2() bool { return testcgroup.Unified() }

// knobInt reads a single-number cgroup file.
func knobInt(t testing.TB, rel, controller, name string) int64 {
	t.Helper()
	v, err := strconv.ParseInt(readKnob(t, rel, controller, name), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return v
}

func keyed(t testing.TB, rel, controller, name string) map[string]int64 {
	out := map[string]int64{}
	for _, line := range strings.Split(readKnob(t, rel, controller, name), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 {
			v, _ := strconv.ParseInt(f[1], 10, 64)
			out[f[0]] = v
		}
	}
	return out
}

// classicShellBomb is the classic shell fork bomb: each copy starts two
// and exits, so its processes are orphans of the host's (or the Pod's)
// PID 1, and it may die out by itself once forks are refused.
const classicShellBomb = "exec 2>/dev/null; f(){ f | f & }; f"

// shellBomb is the classic shell fork bomb made persistent: every process
// keeps re-spawning its pipeline, so the bomb does not fizzle out when
// pids.max refuses forks (the classic one may), and guardian has to
// contain it.
const shellBomb = "exec 2>/dev/null; f(){ while :; do f | f & wait; done; }; f"

// countExe counts the workspace's processes running exe.
func countExe(ws *workspace, exe string) int {
	n := 0
	for _, pid := range testcgroup.Procs(ws.rel) {
		if e, err := ws.fs.Exe(pid); err == nil && e == exe {
			n++
		}
	}
	return n
}

// eventually is poll.Until with d scaled to this machine.
func eventually(d time.Duration, cond func() bool) bool {
	return poll.Until(scaled(d), cond)
}

// oomHandedOver reports whether the kernel leaves the choice of a memory
// victim to guardian, and what it read. On v1 the cgroup's OOM killer is
// off (oom_kill_disable 1). On v2, where it cannot be turned off,
// memory.oom.group is 0 (the kernel would kill one process, never the
// whole workspace) and memory.high sits below memory.max, so a hog is
// throttled there before the kernel acts.
func oomHandedOver(t testing.TB, rel string) (bool, string) {
	t.Helper()
	if !onV2() {
		oc := keyed(t, rel, "memory", "memory.oom_control")
		return oc["oom_kill_disable"] == 1, fmt.Sprintf("oom_kill_disable %d", oc["oom_kill_disable"])
	}
	group, high, max := readKnob(t, rel, "", "memory.oom.group"), readKnob(t, rel, "", "memory.high"), readKnob(t, rel, "", "memory.max")
	h, herr := strconv.ParseUint(high, 10, 64)
	m, merr := strconv.ParseUint(max, 10, 64)
	return group == "0" && herr == nil && merr == nil && h < m, fmt.Sprintf("memory.oom.group %s, memory.high %s, memory.max %s", group, high, max)
}

// heldAtLimit reports whether the workspace's memory is being held at its
// limit without a kill: on v1 a task waits under OOM; on v2 allocations are
// throttled at memory.high.
func heldAtLimit(t testing.TB, rel string) bool {
	t.Helper()
	if !onV2() {
		return keyed(t, rel, "memory", "memory.oom_control")["under_oom"] == 1
	}
	return keyed(t, rel, "", "memory.events")["high"] > 0
}

// setFrozen freezes or thaws the workspace cgroup rel as guardian's
// containment does (v1 freezer.state, v2 cgroup.freeze).
func setFrozen(t testing.TB, rel string, on bool) {
	t.Helper()
	file, v := filepath.Join(testcgroup.Dir(rel, "freezer"), "freezer.state"), map[bool]string{true: "FROZEN", false: "THAWED"}[on]
	if onV2() {
		file, v = filepath.Join(testcgroup.Dir(rel, ""), "cgroup.freeze"), map[bool]string{true: "1", false: "0"}[on]
	}
	if err := os.WriteFile(file, []byte(v), 0); err != nil {
		t.Fatal(err)
	}
}

// frozen reports whether the cgroup rel is frozen or freezing.
func frozen(t testing.TB, rel string) bool {
	t.Helper()
	if onV2() {
		return readKnob(t, rel, "", "cgroup.freeze") != "0"
	}
	return readKnob(t, rel, "freezer", "freezer.state") != "THAWED"
}
