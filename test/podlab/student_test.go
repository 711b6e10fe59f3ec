package podlab_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"labkeep/localrun/stacktest"
	"labkeep/shared/kube"
)

// A student opens the shell lab without a key, gets a generated one, and
// logs in from the host with strict host-key checking against the session's
// own known_hosts line; a second student brings their own key. Each
// session's node refuses the other session's key, and a host key other
// than the session's is detected. Closing a session leaves nothing of it:
// no object in the cluster and no container on the node.
func TestStudentLogsInWithTheSessionsCredentials(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{})

	alice := openLab(t, d, "alice", "shell", nil)
	alice.waitRunning(3 * time.Minute)
	pod := alice.pod()
	if pod.Spec.NodeName != st.Node.Name || alice.running.Nodes[0].SSH.Host != pod.Status.PodIP {
		t.Fatalf("session says ssh %s; the Pod runs on %q at %s", alice.addr(), pod.Spec.NodeName, pod.Status.PodIP)
	}
	firstLogin := time.Now()
	out := alice.mustRun("id -u; hostname")
	t.Logf("alice: open → running %s, → first command over SSH %s (Pod %s at %s)",
		alice.runningAt.Sub(alice.openedAt).Round(10*time.Millisecond), time.Since(firstLogin).Round(time.Millisecond), pod.Name, alice.addr())
	if diff := cmp.Diff("0\n"+pod.Spec.Hostname+"\n", out); diff != "" {
		t.Errorf("id -u; hostname (-want +got):\n%s", diff)
	}

	// Bob brings his own key. The node has room for one workspace at a
	// time here, so his Pod may wait for Alice's to go; his key is his
	// session's from the open on.
	bobKey := stacktest.NewKey(t)
	bob := openLab(t, d, "bob", "shell", bobKey)

	n := alice.running.Nodes[0].SSH
	strict := stacktest.StrictHosts(t, n.KnownHosts)
	if _, err := dial(alice.addr(), n.User, bob.key, strict); err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
		t.Errorf("Bob's key on Alice's node: %v, want authentication refused", err)
	}
	// The other session's host key under Alice's address: a client that
	// trusted it would be talking to someone else's node.
	bobHost, _, _, _, err := ssh.ParseAuthorizedKey([]byte(bob.opened.HostKey))
	if err != nil {
		t.Fatal(err)
	}
	wrong := stacktest.StrictHosts(t, knownhosts.Line([]string{knownhosts.Normalize(alice.addr())}, bobHost))
	if _, err := dial(alice.addr(), n.User, alice.key, wrong); !errHostKey(err) {
		t.Errorf("Alice's node against Bob's host key: %v, want a host key mismatch", err)
	}
	if _, err := dial(alice.addr(), n.User, alice.key, stacktest.StrictHosts(t)); !errHostKey(err) {
		t.Errorf("Alice's node with an empty known_hosts: %v, want an unknown host refused", err)
	}

	aliceClosed := closeAndCheckGone(t, alice)

	bob.waitRunning(3 * time.Minute)
	if out := bob.mustRun("id -u"); out != "0\n" {
		t.Errorf("Bob's id -u = %q", out)
	}
	bn := bob.running.Nodes[0].SSH
	if _, err := dial(bob.addr(), bn.User, alice.key, stacktest.StrictHosts(t, bn.KnownHosts)); err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
		t.Errorf("Alice's key on Bob's node: %v, want authentication refused", err)
	}
	if alice.running.Nodes[0].SSH.KnownHosts == bn.KnownHosts {
		t.Errorf("two sessions share a known_hosts line: %s", bn.KnownHosts)
	}
	t.Logf("bob (own key): his Pod was Ready %s after Alice's close (it waited for her CPU)", readyAt(bob.pod()).Sub(aliceClosed).Round(time.Second))
	closeAndCheckGone(t, bob)
}

// closeAndCheckGone closes s's session and waits until every object of it
// (anchor Pods included) is gone from the cluster and containerd holds no
// container (sandbox included) of its Pods, and the Pods' cgroups are gone.
// It returns when the close was sent.
func closeAndCheckGone(t *testing.T, s *student) time.Time {
	t.Helper()
	ctx := context.Background()
	var uids []string
	pods, err := s.d.Kube.CoreV1().Pods(s.d.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Labels[kube.LabelSession] == s.opened.ID || p.Labels[kube.LabelAnchorOf] == s.opened.ID {
			uids = append(uids, string(p.UID))
		}
	}
	if len(uids) < 2 {
		t.Fatalf("session %s has Pods %v, want the workspace and the anchor's", s.opened.ID, uids)
	}
	before := 0
	for _, uid := range uids {
		before += len(runtimeContainers(t, uid))
	}
	start := time.Now()
	s.close()
	closed := time.Since(start)
	stacktest.Eventually(t, 2*time.Minute, func() (bool, string) {
		var left []string
		for _, o := range s.d.List(stacktest.Listing{}) {
			if o.Session == s.opened.ID || strings.Contains(o.Name, s.opened.ID) {
				left = append(left, o.String())
			}
		}
		return len(left) == 0, fmt.Sprintf("objects of session %s left: %v", s.opened.ID, left)
	})
	objectsGone := time.Since(start)
	stacktest.Eventually(t, 3*time.Minute, func() (bool, string) {
		var left []string
		for _, uid := range uids {
			left = append(left, runtimeContainers(t, uid)...)
			if podCgroupExists(t, uid) {
				left = append(left, "cgroup of Pod "+uid)
			}
		}
		return len(left) == 0, fmt.Sprintf("left on the node: %v", left)
	})
	t.Logf("%s closed: answer %s, objects gone %s, node clean (%d containers before) %s",
		s.name, closed.Round(time.Millisecond), objectsGone.Round(10*time.Millisecond), before, time.Since(start).Round(10*time.Millisecond))
	if s.pod() != nil {
		t.Errorf("workspace Pod %s still there", s.podName())
	}
	return start
}

// readyAt is when the Pod last became Ready (the kubelet reports whole
// seconds).
func readyAt(pod *corev1.Pod) time.Time {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return c.LastTransitionTime.Time
		}
	}
	return time.Time{}
}
