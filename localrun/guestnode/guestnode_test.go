package guestnode_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"labkeep/localrun/guestnode"
	"labkeep/localrun/images"
	"labkeep/localrun/poll"
)

// The guest joins the control plane as a Ready node with the label and
// taint that keep other Pods off it, and runs a Pod on cgroup v2 that the
// host reaches at its Pod IP.
func TestGuestNodeJoinsAndRunsAPod(t *testing.T) {
	n := started(t)
	cs := clientset
	t.Logf("guest node Ready in %v", joined.Round(time.Second))
	ctx := context.Background()
	nodeObj, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if nodeObj.Labels[guestnode.LabelKey] != "v2" {
		t.Errorf("node labels %v lack %s=v2", nodeObj.Labels, guestnode.LabelKey)
	}
	tainted := false
	for _, taint := range nodeObj.Spec.Taints {
		tainted = tainted || (taint.Key == guestnode.TaintKey && taint.Effect == corev1.TaintEffectNoSchedule)
	}
	if !tainted {
		t.Errorf("node taints %v lack %s:NoSchedule", nodeObj.Spec.Taints, guestnode.TaintKey)
	}

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "v2-check", Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName:      n.Name,
			RestartPolicy: corev1.RestartPolicyNever,
			Tolerations:   []corev1.Toleration{{Key: guestnode.TaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			Containers: []corev1.Container{{
				Name: "check", Image: images.Workspace, ImagePullPolicy: corev1.PullNever,
				Command: []string{"/bin/sh", "-c", "cat /proc/self/cgroup; cat /sys/fs/cgroup/cgroup.controllers; sleep 3600"},
			}},
		},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePod(t, pod.Name) })
	var got *corev1.Pod
	poll.Eventually(t, 5*time.Minute, func() (bool, string) {
		got, err = cs.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return got.Status.Phase == corev1.PodRunning, string(got.Status.Phase) + " " + podWhy(got) + "\n" + n.Console(3000)
	})
	// Running is the container started, not its two reads done: on the
	// emulated CPU the second line came later than the first look (seen
	// in a make test run: the output held only "0::/").
	var logs []byte
	poll.Eventually(t, 2*time.Minute, func() (bool, string) {
		logs, err = cs.CoreV1().Pods("default").GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return false, "logs through the kubelet: " + err.Error()
		}
		return strings.Count(string(logs), "\n") >= 2, fmt.Sprintf("both reads' output; so far %q", logs)
	})
	for _, want := range []string{"0::/", "memory", "pids"} {
		if !strings.Contains(string(logs), want) {
			t.Errorf("the Pod's output lacks %q (a private cgroup namespace on cgroup v2):\n%s", want, logs)
		}
	}
	if !strings.HasPrefix(got.Status.PodIP, strings.TrimSuffix(n.PodCIDR, "0/24")) {
		t.Errorf("Pod IP %s not in %s", got.Status.PodIP, n.PodCIDR)
	}
}

func podWhy(p *corev1.Pod) string {
	var out []string
	for _, c := range p.Status.Conditions {
		out = append(out, string(c.Type)+"="+string(c.Status)+" "+c.Message)
	}
	for _, c := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
		if c.State.Waiting != nil {
			out = append(out, c.Name+": "+c.State.Waiting.Reason+" "+c.State.Waiting.Message)
		}
	}
	return strings.Join(out, "; ")
}

// deletePod deletes a test's Pod at once and waits until it is gone, so the
// next test has the node to itself.
func deletePod(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	zero := int64(0)
	if err := clientset.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Errorf("delete Pod %s: %v", name, err)
		return
	}
	poll.Eventually(t, 2*time.Minute, func() (bool, string) {
		_, err := clientset.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		return err != nil, "Pod " + name + " still there"
	})
}
