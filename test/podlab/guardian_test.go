package podlab_test

import (
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/localrun/stacktest"
)

// guardian, a native sidecar, starts before the workspace container, waits
// for it, and then guards that container's cgroup (not its own, not the
// sandbox's) on the node's real cgroups. When root kills the workspace's
// main process the kubelet starts a new container with a new cgroup, and
// guardian guards that one within seconds. When root kills guardian, the
// kubelet restarts it, the limits it wrote stay in force meanwhile, and
// the new guardian takes up the workspace again.
func TestGuardianFollowsTheWorkspaceContainer(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{})
	s := openLab(t, d, "carol", "shell", nil)
	s.waitRunning(3 * time.Minute)
	pod := s.pod()
	want := wantLimits(pod)
	g, ws := status(pod, "guardian"), status(pod, "workspace")

	// Started first: its log waited for a workspace that did not exist yet.
	if len(s.logLines("guardian", false, "waiting for the workspace container")) == 0 {
		t.Errorf("guardian never waited for the workspace: it did not start first\n%s", s.logs("guardian", false))
	}
	guarding := s.logLines("guardian", false, `"msg":"guarding"`, containerID(ws))
	if len(guarding) != 1 {
		t.Errorf("guardian's log names the workspace container %s as guarded %d times, want once:\n%s", containerID(ws), len(guarding), s.logs("guardian", false))
	}
	if code, body, err := guardianAPI(pod, "/healthz"); code != http.StatusOK {
		t.Errorf("guardian /healthz = %d %v %s", code, err, body)
	}
	if diff := cmp.Diff(want, limitsOf(t, pod, containerID(ws))); diff != "" {
		t.Errorf("workspace cgroup limits (-want +got):\n%s", diff)
	}
	// Its own cgroup keeps the kubelet's settings: guardian did not limit
	// itself.
	own := limitsOf(t, pod, containerID(g))
	if own.PidsMax == want.PidsMax || own.MemoryLimit != uint64(pod.Spec.InitContainers[0].Resources.Limits.Memory().Value()) {
		t.Errorf("guardian's own cgroup has %+v: guardian limited itself", own)
	}
	gpid := procsOf(t, pod, containerID(g))[0]
	nsG, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/cgroup", gpid))
	nsHost, _ := os.Readlink("/proc/self/ns/cgroup")
	t.Logf("guardian (host pid %d) runs in cgroup namespace %s (host: %s); it guards %s", gpid, nsG, nsHost, cgroupDir(t, "pids", pod, containerID(ws)))

	// Root kills the workspace's main process (sshd's listener, the oldest
	// sshd) from inside; its own connection goes down with the container.
	killed := time.Now()
	_, _ = s.run("pkill -9 -o -x sshd", nil)
	var newWS string
	stacktest.Eventually(t, 2*time.Minute, func() (bool, string) {
		p := s.pod()
		c := status(p, "workspace")
		if c.RestartCount < 1 || c.State.Running == nil || containerID(c) == containerID(ws) {
			return false, "workspace not restarted: " + s.podState()
		}
		newWS = containerID(c)
		got := limitsOf(t, p, newWS)
		return got == want, fmt.Sprintf("new workspace container %s has %+v, want %+v", newWS, got, want)
	})
	guardedAfter := time.Since(killed)
	stacktest.Eventually(t, time.Minute, func() (bool, string) {
		code, body, err := guardianAPI(pod, "/healthz")
		return code == http.StatusOK, fmt.Sprintf("/healthz %d %v %s", code, err, body)
	})
	if n := len(s.logLines("guardian", false, `"msg":"guarding"`, newWS)); n != 1 {
		t.Errorf("guardian's log names the new workspace container %s %d times, want once:\n%s", newWS, n, s.logs("guardian", false))
	}
	if c := status(s.pod(), "guardian"); c.RestartCount != 0 {
		t.Errorf("guardian restarted %d times when the workspace did", c.RestartCount)
	}
	t.Logf("workspace main process killed → new container guarded with guardian's limits in %s", guardedAfter.Round(10*time.Millisecond))

	// Root kills guardian (same PID namespace, and root has CAP_KILL).
	s.waitSSH(time.Minute)
	pod = s.pod()
	g = status(pod, "guardian")
	killed = time.Now()
	if out, err := s.run("pkill -9 -x guardian; echo $?", nil); err != nil || out != "0\n" {
		t.Fatalf("pkill guardian: %v %q", err, out)
	}
	// The limits are the kernel's: they hold while no guardian runs.
	if diff := cmp.Diff(want, limitsOf(t, pod, newWS)); diff != "" {
		t.Errorf("limits right after guardian was killed (-want +got):\n%s", diff)
	}
	stacktest.Eventually(t, 2*time.Minute, func() (bool, string) {
		c := status(s.pod(), "guardian")
		if c.RestartCount < 1 || containerID(c) == containerID(g) || !c.Ready {
			return false, "guardian not back: " + s.podState()
		}
		code, body, err := guardianAPI(pod, "/healthz")
		return code == http.StatusOK, fmt.Sprintf("/healthz %d %v %s", code, err, body)
	})
	t.Logf("guardian killed → restarted by the kubelet and ready (/healthz 200) in %s", time.Since(killed).Round(10*time.Millisecond))
	pod = s.pod()
	if c := status(pod, "workspace"); containerID(c) != newWS || c.RestartCount != 1 {
		t.Errorf("the workspace container changed when guardian was killed: %s, %d restarts", containerID(c), c.RestartCount)
	}
	if diff := cmp.Diff(want, limitsOf(t, pod, newWS)); diff != "" {
		t.Errorf("limits after guardian's restart (-want +got):\n%s", diff)
	}
	if len(s.logLines("guardian", false, `"msg":"started"`, `"restarted":true`)) != 1 {
		t.Errorf("the restarted guardian did not take up its state:\n%s", s.logs("guardian", false))
	}
	if len(s.logLines("guardian", false, `"msg":"guarding"`, newWS)) != 1 {
		t.Errorf("the restarted guardian does not guard %s:\n%s", newWS, s.logs("guardian", false))
	}
	s.waitSSH(time.Minute)
}
