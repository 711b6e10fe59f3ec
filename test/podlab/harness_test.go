package podlab_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"labkeep/localrun/stacktest"
	"labkeep/shared/session"
)

// sessionJSON is what a student's portal reads from openSession and
// getSession to reach a node over SSH (the harness's portal view).
type sessionJSON = stacktest.SessionView

// student is one student's session of a lab on a Deployment, with the
// credentials the open gave them.
type student struct {
	t    testing.TB
	d    *stacktest.Deployment
	name string
	// opened is the open's answer; running the getSession that first read
	// running.
	opened, running sessionJSON
	// key is the student's private key: the generated one the open
	// returned, or their own.
	key ssh.Signer
	// openedAt and runningAt are wall-clock instants, for the figures.
	openedAt, runningAt time.Time
}

// openLab opens lab for name on d: with publicKey "" labkeep generates the
// key pair and returns the private key once; else own must be the private
// half of publicKey. The open must answer 201 with the session's host key.
func openLab(t testing.TB, d *stacktest.Deployment, name, lab string, own ssh.Signer) *student {
	t.Helper()
	return openLabWith(t, d, d.Token(name, "student"), name, lab, own)
}

// openLabWith is openLab with the student's token.
func openLabWith(t testing.TB, d *stacktest.Deployment, token, name, lab string, own ssh.Signer) *student {
	t.Helper()
	body := fmt.Sprintf(`{"lab":%q}`, lab)
	if own != nil {
		body = fmt.Sprintf(`{"lab":%q,"publicKey":%q}`, lab, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(own.PublicKey()))))
	}
	start := time.Now()
	r := d.Do("POST", "/openSession", token, body, "")
	if r.Status != http.StatusCreated {
		t.Fatalf("open %s for %s = %d %s", lab, name, r.Status, r.Body)
	}
	s := &student{t: t, d: d, name: name, openedAt: start, opened: r.Session}
	if s.opened.HostKey == "" {
		t.Fatalf("open of %s returned no host key: %s", lab, r.Body)
	}
	switch {
	case own != nil && s.opened.PrivateKey != "":
		t.Fatalf("open with the student's own key returned a private key")
	case own != nil:
		s.key = own
	case s.opened.PrivateKey == "":
		t.Fatalf("open without a public key returned no private key: %s", r.Body)
	default:
		k, err := ssh.ParsePrivateKey([]byte(s.opened.PrivateKey))
		if err != nil {
			t.Fatalf("the returned private key does not parse: %v", err)
		}
		s.key = k
	}
	return s
}

// in is s reporting to t (a subtest): its helpers fail t, not the test
// that opened the session.
func (s *student) in(t testing.TB) *student {
	c := *s
	c.t = t
	return &c
}

// get is the student's getSession.
func (s *student) get() (int, sessionJSON) {
	s.t.Helper()
	r := s.d.Do("GET", "/getSession", s.d.Token(s.name, "student"), "", "")
	if r.Status != http.StatusOK {
		return r.Status, sessionJSON{}
	}
	return r.Status, r.Session
}

// waitRunning polls getSession until the session reads running and
// returns it; the node's ssh block then names the Pod's address.
func (s *student) waitRunning(timeout time.Duration) sessionJSON {
	s.t.Helper()
	stacktest.Eventually(s.t, timeout, func() (bool, string) {
		code, v := s.get()
		s.running = v
		return code == http.StatusOK && v.Status == "running" && v.ID == s.opened.ID,
			fmt.Sprintf("session of %s: %d %s %s; Pod: %s", s.name, code, v.Status, v.FailureReason, s.podState())
	})
	s.runningAt = time.Now()
	if len(s.running.Nodes) != 1 || s.running.Nodes[0].SSH.Host == "" || s.running.Nodes[0].SSH.KnownHosts == "" {
		s.t.Fatalf("running session has no reachable node: %+v", s.running.Nodes)
	}
	return s.running
}

// close is the student's closeSession; it must answer 200.
func (s *student) close() {
	s.t.Helper()
	if r := s.d.Close(s.name); r.Status != http.StatusOK {
		s.t.Fatalf("close of %s = %d %s", s.name, r.Status, r.Body)
	}
}

// addr is the node's SSH address as the session gives it.
func (s *student) addr() string {
	n := s.running.Nodes[0].SSH
	return net.JoinHostPort(n.Host, strconv.Itoa(n.Port))
}

// podName is the session's workspace Pod.
func (s *student) podName() string {
	return session.NodeName(s.opened.ID, s.opened.Nodes[0].Name)
}

// pod reads the workspace Pod (nil once it is gone).
func (s *student) pod() *corev1.Pod {
	s.t.Helper()
	p, err := s.d.Kube.CoreV1().Pods(s.d.Namespace).Get(context.Background(), s.podName(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		s.t.Fatal(err)
	}
	return p
}

// podState summarises the Pod for failure messages.
func (s *student) podState() string {
	p := s.pod()
	if p == nil {
		return "gone"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s ip=%s", p.Status.Phase, p.Status.PodIP)
	for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
		fmt.Fprintf(&b, " %s(ready=%v restarts=%d %s", cs.Name, cs.Ready, cs.RestartCount, stateOf(cs.State))
		if cs.LastTerminationState.Terminated != nil {
			fmt.Fprintf(&b, ", last %s", stateOf(cs.LastTerminationState))
		}
		b.WriteString(")")
	}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			fmt.Fprintf(&b, " %s: %s", c.Type, c.Message)
		}
	}
	return b.String()
}

func stateOf(cs corev1.ContainerState) string {
	switch {
	case cs.Running != nil:
		return "running"
	case cs.Waiting != nil:
		return "waiting " + cs.Waiting.Reason + " " + cs.Waiting.Message
	case cs.Terminated != nil:
		return fmt.Sprintf("terminated %s exit %d", cs.Terminated.Reason, cs.Terminated.ExitCode)
	}
	return "unknown"
}

// status finds the named container's status in pod (init containers too).
func status(pod *corev1.Pod, name string) corev1.ContainerStatus {
	for _, cs := range append(slices.Clone(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...) {
		if cs.Name == name {
			return cs
		}
	}
	return corev1.ContainerStatus{}
}

// containerID is the runtime's id of a container status ("containerd://…").
func containerID(cs corev1.ContainerStatus) string {
	_, id, _ := strings.Cut(cs.ContainerID, "://")
	return id
}

// dial connects as user to addr with key, verifying the host key with
// hostKey, within stacktest.LoginTimeout.
func dial(addr, user string, key ssh.Signer, hostKey ssh.HostKeyCallback) (*ssh.Client, error) {
	return stacktest.Dial(addr, user, key, hostKey, stacktest.LoginTimeout, false)
}

// connect logs the student in as the session says (user, address, strict
// known_hosts from the session's own line).
func (s *student) connect() (*ssh.Client, error) {
	n := s.running.Nodes[0].SSH
	return dial(s.addr(), n.User, s.key, stacktest.StrictHosts(s.t, n.KnownHosts))
}

// run runs cmd over a new SSH connection and returns its combined output;
// stdin, if not nil, is the command's input.
func (s *student) run(cmd string, stdin io.Reader) (string, error) {
	c, err := s.connect()
	if err != nil {
		return "", err
	}
	defer c.Close()
	sess, err := c.NewSession()
	if err != nil {
		return "", err
	}
	defer sess.Close()
	sess.Stdin = stdin
	out, err := sess.CombinedOutput(cmd)
	return string(out), err
}

// mustRun is run that fails the test on error.
func (s *student) mustRun(cmd string) string {
	s.t.Helper()
	out, err := s.run(cmd, nil)
	if err != nil {
		s.t.Fatalf("ssh %s %q: %v\n%s\nPod: %s\nsshd:\n%s", s.addr(), cmd, err, out, s.podState(), s.logs("workspace", false))
	}
	return out
}

// logs is the end of a container's log in the workspace Pod, as the
// kubelet serves it (sshd logs to stderr, guardian in JSON).
func (s *student) logs(container string, previous bool) string {
	s.t.Helper()
	tail := int64(40)
	b, err := s.d.Kube.CoreV1().Pods(s.d.Namespace).GetLogs(s.podName(), &corev1.PodLogOptions{Container: container, Previous: previous, TailLines: &tail}).DoRaw(context.Background())
	if err != nil {
		return fmt.Sprintf("(logs of %s: %v)", container, err)
	}
	return string(b)
}

// waitSSH polls until a login runs a command, and returns how long that took.
func (s *student) waitSSH(timeout time.Duration) time.Duration {
	s.t.Helper()
	start := time.Now()
	stacktest.Eventually(s.t, timeout, func() (bool, string) {
		_, err := s.run("true", nil)
		return err == nil, fmt.Sprintf("ssh: %v; Pod: %s", err, s.podState())
	})
	return time.Since(start)
}

// loginLoop starts logging s in every interval.
func (s *student) loginLoop(interval time.Duration) *stacktest.Logins {
	n := s.running.Nodes[0].SSH
	return stacktest.LoginLoop(s.addr(), n.User, s.key, stacktest.StrictHosts(s.t, n.KnownHosts), interval, stacktest.LoginTimeout)
}

// guardianAPI asks the Pod's guardian for path over the Pod network.
func guardianAPI(pod *corev1.Pod, path string) (int, []byte, error) {
	c := &http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get("http://" + net.JoinHostPort(pod.Status.PodIP, "9090") + path)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// alert is one of guardian's alerts as GET /alerts lists them.
type alert struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	Count   int    `json:"count"`
}

// alerts lists the Pod's guardian's alerts.
func alerts(t testing.TB, pod *corev1.Pod) []alert {
	t.Helper()
	code, body, err := guardianAPI(pod, "/alerts")
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET /alerts: %d %v %s", code, err, body)
	}
	var v struct {
		Alerts []alert `json:"alerts"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatal(err)
	}
	return v.Alerts
}

// kinds are the alerts' kinds.
func kinds(as []alert) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.Kind)
	}
	return out
}

// cgroupDir is a container's cgroup directory in the host's v1 hierarchy of
// controller: <node cgroup root>/kubepods/[<qos>/]pod<uid>/<container id>.
// It fails the test unless exactly one directory matches.
func cgroupDir(t testing.TB, controller string, pod *corev1.Pod, id string) string {
	t.Helper()
	root := filepath.Join("/sys/fs/cgroup", controller, st.Node.CgroupRoot, "kubepods")
	var found []string
	for _, pattern := range []string{"pod%s/%s", "*/pod%s/%s"} {
		m, err := filepath.Glob(filepath.Join(root, fmt.Sprintf(pattern, pod.UID, id)))
		if err != nil {
			t.Fatal(err)
		}
		found = append(found, m...)
	}
	if len(found) != 1 {
		t.Fatalf("cgroup of container %s of Pod %s in %s: found %v", id, pod.UID, root, found)
	}
	return found[0]
}

// podCgroupExists reports whether the Pod's cgroup is still on the host.
func podCgroupExists(t testing.TB, uid string) bool {
	t.Helper()
	root := filepath.Join("/sys/fs/cgroup", "pids", st.Node.CgroupRoot, "kubepods")
	for _, pattern := range []string{"pod" + uid, "*/pod" + uid} {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			t.Fatal(err)
		}
		if len(m) > 0 {
			return true
		}
	}
	return false
}

// knob reads a cgroup file.
func knob(t testing.TB, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// keyed parses a "key value" cgroup file (memory.oom_control, memory.stat).
func keyed(t testing.TB, dir, name string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, line := range strings.Split(knob(t, dir, name), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err == nil {
			out[k] = n
		}
	}
	return out
}

// runtimeContainers lists, by asking containerd (the node's runtime)
// directly, the containers it holds for the Pod with uid (its sandbox
// included), as "id image" lines.
func runtimeContainers(t testing.TB, uid string) []string {
	t.Helper()
	out, err := exec.Command("ctr", "--address", st.Node.ContainerdSocket, "-n", "k8s.io", "containers", "ls",
		`labels."io.kubernetes.pod.uid"==`+uid).CombinedOutput()
	if err != nil {
		t.Fatalf("ctr containers ls: %v\n%s", err, out)
	}
	var ids []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) >= 2 {
			ids = append(ids, f[0]+" "+f[1])
		}
	}
	return ids
}

// errHostKey reports whether err is a strict host-key check refusing the
// server's key.
func errHostKey(err error) bool {
	var ke *knownhosts.KeyError
	return errors.As(err, &ke)
}

// workspaceLimits are the kernel settings guardian must have written on a
// workspace container's cgroup, read from the host: pids.max and the v1
// hard memory limit.
type workspaceLimits struct {
	PidsMax     string
	MemoryLimit uint64
}

// wantLimits are guardian's limits for pod: pids.max 4096 and memory.max
// 0.98·M (page-rounded) for the workspace's memory limit M.
func wantLimits(pod *corev1.Pod) workspaceLimits {
	var m int64
	for _, c := range pod.Spec.Containers {
		if c.Name == "workspace" {
			m = c.Resources.Limits.Memory().Value()
		}
	}
	page := uint64(os.Getpagesize())
	return workspaceLimits{PidsMax: "4096", MemoryLimit: uint64(0.98*float64(m)) / page * page}
}

// limitsOf reads the limits on a container's cgroup.
func limitsOf(t testing.TB, pod *corev1.Pod, id string) workspaceLimits {
	t.Helper()
	mem, err := strconv.ParseUint(knob(t, cgroupDir(t, "memory", pod, id), "memory.limit_in_bytes"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return workspaceLimits{PidsMax: knob(t, cgroupDir(t, "pids", pod, id), "pids.max"), MemoryLimit: mem}
}

// procsOf lists the host PIDs in a container's cgroup.
func procsOf(t testing.TB, pod *corev1.Pod, id string) []int {
	t.Helper()
	var pids []int
	for _, f := range strings.Fields(knob(t, cgroupDir(t, "pids", pod, id), "cgroup.procs")) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	return pids
}

// countExe counts the processes of a container whose executable's base
// name is exe (a process that exits meanwhile is not counted).
func countExe(t testing.TB, pod *corev1.Pod, id, exe string) int {
	t.Helper()
	n := 0
	for _, pid := range procsOf(t, pod, id) {
		if target, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && filepath.Base(target) == exe {
			n++
		}
	}
	return n
}

// logLines are the lines of a container's log that contain all of subs.
func (s *student) logLines(container string, previous bool, subs ...string) []string {
	s.t.Helper()
	b, err := s.d.Kube.CoreV1().Pods(s.d.Namespace).GetLogs(s.podName(), &corev1.PodLogOptions{Container: container, Previous: previous}).DoRaw(context.Background())
	if err != nil {
		s.t.Fatalf("logs of %s: %v", container, err)
	}
	var out []string
next:
	for _, line := range strings.Split(string(b), "\n") {
		for _, sub := range subs {
			if !strings.Contains(line, sub) {
				continue next
			}
		}
		out = append(out, line)
	}
	return out
}

// records are guardian's JSON log records with message msg.
func (s *student) records(msg string) []map[string]any {
	s.t.Helper()
	var out []map[string]any
	for _, line := range s.logLines("guardian", false, `"msg":"`+msg+`"`) {
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err == nil && r["msg"] == msg {
			out = append(out, r)
		}
	}
	return out
}

// upload copies the local file to path in the workspace over SSH, mode 0755.
func (s *student) upload(local, path string) {
	s.t.Helper()
	f, err := os.Open(local)
	if err != nil {
		s.t.Fatal(err)
	}
	defer f.Close()
	if out, err := s.run(fmt.Sprintf("cat > %s && chmod 0755 %s", path, path), f); err != nil {
		s.t.Fatalf("upload %s: %v %s", path, err, out)
	}
}

// buildWorkload builds guardian's misbehaving user (hog, bomb), static, so
// it runs in the Debian workspace as it does in guardian's own e2e tests.
func buildWorkload(t testing.TB) string {
	t.Helper()
	return stacktest.BuildStatic(t, "labkeep/guardian/internal/workload")
}
