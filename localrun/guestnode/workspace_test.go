package guestnode_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/remotecommand"

	"labkeep/localrun/guestnode"
	"labkeep/localrun/images"
	"labkeep/localrun/poll"
	"labkeep/localrun/stacktest"
	"labkeep/shared/kube"
)

// The production workspace Pod (infra/guardian/workspace-pod.yaml, nothing
// stripped) on the cgroup v2 node, read from inside the running Pod:
// guardian gives sshd's listener oom_score_adj -1000 and SCHED_RR with
// reset-on-fork and itself -999, which the local node's root cannot grant;
// the limits sit on the workspace's own cgroup, which it sees as / of its
// private cgroup namespace; after the workspace container restarts,
// guardian guards the new one.
func TestProductionWorkspacePodOnCgroupV2(t *testing.T) {
	n := started(t)
	ctx := context.Background()
	memory := resource.MustParse("512Mi")
	start := time.Now()
	pod, _ := runWorkspace(t, n, memory, stacktest.NewKey(t))
	t.Logf("workspace Pod ready %v after it was created", time.Since(start).Round(time.Second))

	// Every process the workspace sees (the Pod shares one PID namespace):
	// PID, command line, oom_score_adj, scheduling as chrt prints it.
	procs := func() []proc {
		t.Helper()
		out := execWorkspace(t, pod.Name, `for p in /proc/[0-9]*; do
  pid=${p#/proc/}
  [ "$pid" = "$$" ] && continue
  cmd=$(tr '\0' ' ' < $p/cmdline 2>/dev/null) || continue
  [ -n "$cmd" ] || continue
  echo "$pid|$cmd|$(cat $p/oom_score_adj 2>/dev/null)|$(chrt -p $pid 2>/dev/null | head -1)"
done`)
		var ps []proc
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.SplitN(line, "|", 4)
			if len(f) != 4 {
				continue
			}
			pid, _ := strconv.Atoi(f[0])
			adj, _ := strconv.Atoi(strings.TrimSpace(f[2]))
			ps = append(ps, proc{pid, strings.TrimSpace(f[1]), adj, f[3]})
		}
		return ps
	}
	find := func(ps []proc, substr string) (proc, bool) {
		for _, p := range ps {
			if strings.Contains(p.cmd, substr) {
				return p, true
			}
		}
		return proc{}, false
	}
	var listener, guardian proc
	pctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := poll.Until(pctx, func() (bool, string) {
		ps := procs()
		var ok1, ok2 bool
		listener, ok1 = find(ps, "[listener]")
		guardian, ok2 = find(ps, "guardian")
		return ok1 && ok2 && listener.oomScoreAdj == -1000 && guardian.oomScoreAdj == -999 && strings.Contains(listener.sched, "SCHED_RR|SCHED_RESET_ON_FORK"),
			fmt.Sprintf("listener %+v, guardian %+v (all: %+v)", listener, guardian, ps)
	}); err != nil {
		t.Fatalf("not within a minute: %v\nguardian's log:\n%s", err, guardianLogSince(t, pod.Name, start))
	}
	t.Logf("inside the Pod: sshd listener pid %d oom_score_adj %d, %q; guardian pid %d oom_score_adj %d",
		listener.pid, listener.oomScoreAdj, listener.sched, guardian.pid, guardian.oomScoreAdj)

	// The workspace's own cgroup, / in its cgroup namespace.
	m := memory.Value()
	wantLimits := fmt.Sprintf("0::/\nmax %d\nhigh %d\npids %d\noom.group 0", m*98/100, m*90/100, 4096)
	limits := func() string {
		return strings.TrimSpace(execWorkspace(t, pod.Name, `cat /proc/self/cgroup; echo "max $(cat /sys/fs/cgroup/memory.max)"; echo "high $(cat /sys/fs/cgroup/memory.high)"; echo "pids $(cat /sys/fs/cgroup/pids.max)"; echo "oom.group $(cat /sys/fs/cgroup/memory.oom.group)"`))
	}
	if got := limits(); !limitsMatch(got, wantLimits) {
		t.Errorf("the workspace's cgroup, seen from inside:\n%s\nwant (within a page):\n%s", got, wantLimits)
	}

	// The workspace container restarts (its sshd killed); guardian guards
	// the new container's cgroup.
	before := guardedRecords(t, pod.Name)
	execWorkspace(t, pod.Name, fmt.Sprintf("kill -9 %d", listener.pid))
	var restarted time.Time
	poll.Eventually(t, 2*time.Minute, func() (bool, string) {
		p, err := clientset.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range p.Status.ContainerStatuses {
			if c.Name == "workspace" && c.RestartCount > 0 && c.State.Running != nil {
				restarted = c.State.Running.StartedAt.Time
				return true, ""
			}
		}
		return false, podWhy(p)
	})
	var guarded time.Time
	poll.Eventually(t, time.Minute, func() (bool, string) {
		recs := guardedRecords(t, pod.Name)
		if len(recs) > len(before) {
			guarded = recs[len(recs)-1]
			return true, ""
		}
		return false, fmt.Sprintf("guardian logged %d guarding records, as before the restart", len(recs))
	})
	t.Logf("workspace container restarted at %s (the kubelet reports it to the second); guardian guarding its new cgroup at %s (%v from that second)",
		restarted.Format(time.RFC3339), guarded.Format(time.RFC3339Nano), guarded.Sub(restarted).Round(10*time.Millisecond))
	if got := limits(); !limitsMatch(got, wantLimits) {
		t.Errorf("the restarted workspace's cgroup, seen from inside:\n%s\nwant (within a page):\n%s", got, wantLimits)
	}
}

type proc struct {
	pid         int
	cmd         string
	oomScoreAdj int
	sched       string
}

// limitsMatch compares the limits read inside the workspace with want,
// memory values within a page (the kernel rounds them down to pages).
func limitsMatch(got, want string) bool {
	g, w := strings.Fields(got), strings.Fields(want)
	if len(g) != len(w) {
		return false
	}
	for i := range g {
		gv, gerr := strconv.ParseInt(g[i], 10, 64)
		wv, werr := strconv.ParseInt(w[i], 10, 64)
		switch {
		case gerr == nil && werr == nil:
			if d := wv - gv; d < 0 || d >= 4096 {
				return false
			}
		case g[i] != w[i]:
			return false
		}
	}
	return true
}

// guardedRecords returns when guardian logged "guarding" (a workspace
// cgroup taken in hand), oldest first.
func guardedRecords(t *testing.T, pod string) []time.Time {
	t.Helper()
	var out []time.Time
	for _, r := range guardianRecords(t, pod, "guarding") {
		at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(r["time"]))
		if err != nil {
			t.Fatalf("guardian's record %v: %v", r, err)
		}
		out = append(out, at)
	}
	return out
}

// execWorkspace runs script with sh in the Pod's workspace container,
// through the API server and the guest's kubelet, and returns its output.
// A script that kills the container may end the stream early; its error
// is then not the test's.
func execWorkspace(t *testing.T, pod, script string) string {
	t.Helper()
	return execWorkspaceWithin(t, pod, script, time.Minute)
}

// execWorkspaceWithin is execWorkspace bounded by within.
func execWorkspaceWithin(t *testing.T, pod, script string, within time.Duration) string {
	t.Helper()
	ex, err := kube.WorkspaceExecutor(cp.Admin, clientset, "default", pod, corev1.PodExecOptions{Command: []string{"sh", "-c", script}, Stdout: true, Stderr: true})
	if err != nil {
		t.Fatal(err)
	}
	var out, errb syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &errb}); err != nil && !strings.HasPrefix(script, "kill ") {
		t.Fatalf("exec %q: %v; stderr: %s", script, err, errb.String())
	}
	return out.String()
}

// syncBuffer is a buffer that may be read while written: a stream that
// ends by its context's deadline leaves its copiers writing.
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

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// runWorkspace creates the production workspace Pod (workspacePodFor) on
// the guest node, deleted when the test ends, and returns it once it is
// Ready (sshd accepts connections), with its SSH host key.
func runWorkspace(t *testing.T, n *guestnode.Node, memory resource.Quantity, student ssh.Signer) (*corev1.Pod, ssh.PublicKey) {
	t.Helper()
	ctx := context.Background()
	pod, hostKey := workspacePodFor(t, n, memory, student)
	if _, err := clientset.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePod(t, pod.Name) })
	poll.Eventually(t, 5*time.Minute, func() (bool, string) {
		p, err := clientset.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		pod = p
		return podReady(p), string(p.Status.Phase) + " " + podWhy(p) + "\n" + n.Console(2000)
	})
	return pod, hostKey
}

// workspacePodFor is the production workspace Pod filled in as labkeep's
// Kubernetes adapter does for a session (name, images, the session's
// Secret with its host key, the student's key and the cleanup token, the
// workspace's resources), and placed on the guest node; it returns the
// Pod, named after the test, and its SSH host key.
func workspacePodFor(t *testing.T, n *guestnode.Node, memory resource.Quantity, student ssh.Signer) (*corev1.Pod, ssh.PublicKey) {
	t.Helper()
	name := "ws-" + strings.ToLower(strings.ReplaceAll(t.Name(), "_", "-"))
	if len(name) > 50 {
		name = name[:50]
	}
	hostPEM, hostPub := hostKey(t)
	pod, err := kube.ParseWorkspacePod(nil)
	if err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Data: map[string][]byte{
			"ssh-host-key":        []byte(hostPEM),
			"ssh-authorized-keys": ssh.MarshalAuthorizedKey(student.PublicKey()),
			kube.CleanupTokenKey:  []byte("v2-node-cleanup-token-0123456789"),
		},
	}
	ctx := context.Background()
	if _, err := clientset.CoreV1().Secrets("default").Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		clientset.CoreV1().Secrets("default").Delete(context.Background(), secret.Name, metav1.DeleteOptions{})
	})
	pod.ObjectMeta = metav1.ObjectMeta{Name: name, Namespace: "default", Labels: pod.Labels}
	pod.Spec.NodeName = n.Name
	pod.Spec.Tolerations = append(pod.Spec.Tolerations, corev1.Toleration{Key: guestnode.TaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
	mount := corev1.VolumeMount{Name: "labkeep", MountPath: "/etc/labkeep", ReadOnly: true}
	pod.Spec.Volumes = append([]corev1.Volume{{Name: "labkeep", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secret.Name}}}}, pod.Spec.Volumes...)
	g := &pod.Spec.InitContainers[0]
	g.Image = images.Guardian
	g.VolumeMounts = append([]corev1.VolumeMount{mount}, g.VolumeMounts...)
	for i := range g.Env {
		if g.Env[i].Name == "GUARDIAN_CLEANUP_TOKEN" {
			g.Env[i].ValueFrom.SecretKeyRef.Name = secret.Name
		}
	}
	w := &pod.Spec.Containers[0]
	w.Image = images.Workspace
	w.VolumeMounts = append([]corev1.VolumeMount{mount}, w.VolumeMounts...)
	res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: memory}
	w.Resources = corev1.ResourceRequirements{Requests: res, Limits: res}
	return pod, hostPub
}

// hostKey is a fresh ed25519 host key: the private key in OpenSSH PEM
// format, as the session's Secret holds it, and the public key.
func hostKey(t *testing.T) (string, ssh.PublicKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "v2 node host key")
	if err != nil {
		t.Fatal(err)
	}
	p, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(block)), p
}
