package podlab_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"labkeep/localrun/stacktest"
	"labkeep/shared/kube"
)

// capabilityBit is the kernel's number of each capability a workspace may
// hold (linux/capability.h), as /proc/PID/status shows them.
var capabilityBit = map[corev1.Capability]uint{
	"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6, "SETUID": 7,
	"NET_BIND_SERVICE": 10, "NET_RAW": 13, "SYS_CHROOT": 18, "AUDIT_WRITE": 29,
}

// capMask is the /proc/PID/status value of exactly caps.
func capMask(t *testing.T, caps []corev1.Capability) string {
	t.Helper()
	var m uint64
	for _, c := range caps {
		bit, ok := capabilityBit[c]
		if !ok {
			t.Fatalf("no bit known for capability %s", c)
		}
		m |= 1 << bit
	}
	return fmt.Sprintf("%016x", m)
}

// The student's root in the real workspace image, on the real node, holds
// exactly the workspace set (kube.WorkspaceCapabilities), plus NET_RAW
// only in a lab that opts in, under the runtime's default seccomp filter
// (Seccomp: 2) with no_new_privs — both sshd (the container's main
// process) and the login shell — and sshd still accepts the session's
// key. Root can still do what a lab's root does (chown, run a command as
// another user, chroot), but not create a device node. The session's
// anchor runs its pause unprivileged.
func TestWorkspaceRootIsConfined(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{LabsYAML: `labs:
- name: shell
  kind: pod
  image: ghcr.io/labkeep/workspace:debian12
  nodes: [{role: workspace, cpu: "1", memory: 1Gi}]
- name: shell-net
  kind: pod
  image: ghcr.io/labkeep/workspace:debian12
  capabilities: [NET_RAW]
  nodes: [{role: workspace, cpu: "1", memory: 1Gi}]
`})
	tests := []struct {
		lab  string
		caps []corev1.Capability
	}{
		{"shell", kube.WorkspaceCapabilities},
		{"shell-net", append(append([]corev1.Capability(nil), kube.WorkspaceCapabilities...), "NET_RAW")},
	}
	for i, tc := range tests {
		t.Run(tc.lab, func(t *testing.T) {
			// One workspace at a time: the node has room for one.
			s := openLab(t, d, fmt.Sprintf("confined-%d", i), tc.lab, nil)
			defer s.close()
			s.waitRunning(3 * time.Minute)
			// The login itself is the check that sshd works with this set.
			out := s.mustRun(`for p in self $(pgrep -o -x sshd); do
  name=shell; [ "$p" = self ] || name=sshd
  grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' /proc/$p/status | sed "s/^/$name /"
done`)
			got := map[string]string{}
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				f := strings.Fields(line)
				if len(f) != 3 {
					t.Fatalf("unexpected line %q in\n%s", line, out)
				}
				got[f[0]+" "+strings.TrimSuffix(f[1], ":")] = f[2]
			}
			mask := capMask(t, tc.caps)
			want := map[string]string{}
			for _, who := range []string{"shell", "sshd"} {
				for k, v := range map[string]string{"CapEff": mask, "CapPrm": mask, "CapBnd": mask, "NoNewPrivs": "1", "Seccomp": "2"} {
					want[who+" "+k] = v
				}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("/proc/PID/status of the login shell and sshd (-want +got):\n%s", diff)
			}
			t.Logf("%s: root's CapEff %s (%v), NoNewPrivs %s, Seccomp %s", tc.lab, got["shell CapEff"], tc.caps, got["shell NoNewPrivs"], got["shell Seccomp"])

			// The anchor's pause runs unprivileged too (uid 65535, no
			// capabilities, read-only root, RuntimeDefault seccomp).
			stacktest.Eventually(t, time.Minute, func() (bool, string) {
				pods, err := d.Kube.CoreV1().Pods(d.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: kube.LabelAnchorOf + "=" + s.opened.ID})
				if err != nil || len(pods.Items) != 1 {
					return false, fmt.Sprintf("anchor Pods: %v", err)
				}
				cs := status(&pods.Items[0], "pause")
				return cs.State.Running != nil && cs.RestartCount == 0, fmt.Sprintf("anchor's pause: %s, %d restarts", stateOf(cs.State), cs.RestartCount)
			})

			wantDone, gotDone := s.expect([]check{
				{"chown to another user (CHOWN)", "touch /tmp/f && chown nobody /tmp/f && stat -c %U /tmp/f", "nobody"},
				{"a command as another user (SETUID, SETGID)", "setpriv --reuid=65534 --regid=65534 --clear-groups id -un", "nobody"},
				{"chroot (SYS_CHROOT)", "chroot / /bin/true && echo done", "done"},
				{"a device node (MKNOD dropped)", "mknod /tmp/null c 1 3 2>/dev/null && echo made || echo refused", "refused"},
			})
			if diff := cmp.Diff(wantDone, gotDone); diff != "" {
				t.Errorf("what root can do (-want +got):\n%s", diff)
			}
		})
	}
}

// check is a command run in the workspace over SSH and the output (trimmed)
// it should print.
type check struct{ what, cmd, want string }

// expect runs every check as the student and returns, in order, the
// "what: output" lines wanted and got, for cmp.Diff.
func (s *student) expect(checks []check) (want, got []string) {
	s.t.Helper()
	for _, c := range checks {
		got = append(got, c.what+": "+strings.TrimSpace(s.mustRun(c.cmd)))
		want = append(want, c.what+": "+c.want)
	}
	return want, got
}
