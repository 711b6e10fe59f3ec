package guestnode_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"labkeep/infra"
	"labkeep/localrun/devserve"
	"labkeep/localrun/guestnode"
	"labkeep/localrun/poll"
	"labkeep/localrun/stacktest"
	"labkeep/shared/kube"
	"labkeep/shared/session"
)

// The session functions place a Pod lab on the cgroup v2 node as a
// platform would: their workspace Pod definition
// (LABKEEP_WORKSPACE_POD_FILE) is the production one with the node's
// selector and toleration added and nothing taken out, and the production
// admission policy, its parameters listing the node's taint, admits it. A
// student opens the lab, logs in with the session's credentials, is root
// in the workspace container's own cgroup under guardian's limits, and
// closes it: the Pod goes.
func TestFunctionsPlaceALabOnTheV2Node(t *testing.T) {
	n := started(t)
	ctx := context.Background()
	prod, err := kube.ParseWorkspacePod(nil)
	if err != nil {
		t.Fatal(err)
	}
	placed := prod.DeepCopy()
	placed.Spec.NodeSelector = map[string]string{guestnode.LabelKey: "v2"}
	placed.Spec.Tolerations = append(placed.Spec.Tolerations,
		corev1.Toleration{Key: guestnode.TaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
	b, err := yaml.Marshal(placed)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "workspace-pod.yaml")
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
	d := stacktest.Deploy(t, st, stacktest.Options{WorkspacePodFile: file})
	adm, err := devserve.Admission(d.Env, false, "")
	if err != nil {
		t.Fatal(err)
	}
	adm.Data["tolerations"] = guestnode.TaintKey
	if err := infra.ApplyAdmission(ctx, st.Admin(), infra.Placement{Functions: d.FunctionsNamespace, Sessions: d.Namespace}, adm); err != nil {
		t.Fatal(err)
	}

	opened := d.Opened("erin", "shell")
	key, err := ssh.ParsePrivateKey([]byte(opened.PrivateKey))
	if err != nil {
		t.Fatalf("the session's private key: %v", err)
	}
	name := session.NodeName(opened.ID, opened.Nodes[0].Name)
	var running stacktest.SessionView
	var pod *corev1.Pod
	poll.Eventually(t, 5*time.Minute, func() (bool, string) {
		r := d.Do("GET", "/getSession", d.Token("erin", "student"), "", "")
		running = r.Session
		if pod, err = d.Kube.CoreV1().Pods(d.Namespace).Get(ctx, name, metav1.GetOptions{}); err != nil {
			return false, fmt.Sprintf("session %d %s; Pod: %v", r.Status, r.Body, err)
		}
		return r.Status == http.StatusOK && running.Status == "running",
			fmt.Sprintf("session %d %s; Pod on %q: %s %s; events: %s\nnode's console:\n%s", r.Status, r.Body, pod.Spec.NodeName, pod.Status.Phase, podWhy(pod), podEvents(t, d.Namespace, name), n.Console(2000))
	})
	if pod.Spec.NodeName != n.Name {
		t.Fatalf("the lab's Pod runs on %q; want the v2 node %q", pod.Spec.NodeName, n.Name)
	}
	containers := func(p *corev1.Pod) map[string]*corev1.SecurityContext {
		out := map[string]*corev1.SecurityContext{}
		for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
			out[c.Name] = c.SecurityContext
		}
		return out
	}
	if diff := cmp.Diff(containers(prod), containers(pod)); diff != "" {
		t.Errorf("the lab's containers' security contexts differ from the production workspace Pod's (-production +lab):\n%s", diff)
	}

	ssh0 := running.Nodes[0].SSH
	addr := net.JoinHostPort(ssh0.Host, strconv.Itoa(ssh0.Port))
	hosts := stacktest.StrictHosts(t, ssh0.KnownHosts)
	var out string
	poll.Eventually(t, time.Minute, func() (bool, string) {
		out, err = stacktest.SSHRun(addr, ssh0.User, key, hosts, "id -u; cat /proc/self/cgroup; cat /sys/fs/cgroup/pids.max /sys/fs/cgroup/memory.oom.group")
		return err == nil, fmt.Sprintf("ssh %s@%s: %v %s", ssh0.User, addr, err, out)
	})
	// Root, in a private cgroup namespace whose root is the workspace
	// container's own cgroup, where guardian wrote pids.max and took OOM
	// handling from the runtime (memory.oom.group 0).
	if diff := cmp.Diff([]string{"0", "0::/", "4096", "0"}, strings.Fields(out)); diff != "" {
		t.Errorf("uid, cgroup, pids.max and memory.oom.group seen by the student (-want +got):\n%s", diff)
	}
	t.Logf("lab on the v2 node %s: open → running %s, SSH as %s", n.Name, running.ReadyAt.Sub(opened.StartedAt).Round(time.Second), ssh0.User)

	if r := d.Close("erin"); r.Status != http.StatusOK {
		t.Fatalf("close = %d %s", r.Status, r.Body)
	}
	poll.Eventually(t, 2*time.Minute, func() (bool, string) {
		_, err := d.Kube.CoreV1().Pods(d.Namespace).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("the lab's Pod is still there (%v)", err)
	})
}

// podEvents are the events about Pod name in namespace, oldest first.
func podEvents(t *testing.T, namespace, name string) string {
	t.Helper()
	evs, err := clientset.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, e := range evs.Items {
		out = append(out, e.Reason+": "+e.Message)
	}
	return strings.Join(out, "; ")
}
