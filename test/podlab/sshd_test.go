package podlab_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/localrun/stacktest"
)

// sshd is the workspace container's main process, so when root kills it the
// container ends and the kubelet starts it again: SSH comes back by itself,
// with the same address and host key. What the user had inside the
// container goes (processes, files on the container's root filesystem, which
// is new); what lives in the Pod stays (the /etc/labkeep Secret volume with
// the session's keys, the Pod-wide /dev/shm).
func TestKilledSSHDComesBack(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{})
	s := openLab(t, d, "dave", "shell", nil)
	s.waitRunning(3 * time.Minute)

	// What the user has before: a file on the root filesystem, one in
	// /dev/shm and a background process.
	s.mustRun("echo mine > /root/notes; echo mine > /dev/shm/notes; setsid sleep 100000 </dev/null >/dev/null 2>&1 &")
	if out := s.mustRun("pgrep -x sleep | wc -l"); out != "1\n" {
		t.Fatalf("background process not started: %q", out)
	}

	n := killSSHD(t, s)
	t.Logf("sshd killed → SSH back after N = %s (the session's known_hosts line still verifies the host key)", n.Round(10*time.Millisecond))

	want, got := s.expect([]check{
		{"a file on the container's root filesystem (new container, new root fs)", "cat /root/notes 2>/dev/null || echo lost", "lost"},
		{"the user's background process", "pgrep -x sleep >/dev/null && echo kept || echo lost", "lost"},
		{"a file in /dev/shm (the Pod's IPC namespace outlives the container)", "cat /dev/shm/notes 2>/dev/null || echo lost", "mine"},
		{"the session's keys on the /etc/labkeep Secret volume", "test -s /etc/labkeep/ssh-authorized-keys && echo kept || echo lost", "kept"},
	})
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("after sshd was killed (-want +got):\n%s", diff)
	}
	t.Logf("the user loses and keeps: %s", strings.Join(got, "; "))

	// Killed again, the container restarts after the kubelet's crash
	// back-off (10 s, doubling up to 5 min for each further kill).
	t.Logf("sshd killed a second time → SSH back after %s", killSSHD(t, s).Round(10*time.Millisecond))
}

// killSSHD kills the workspace's sshd listener (the oldest sshd) as root
// from inside, waits until the student can log in again and the Pod shows
// the restarted container, and returns the time from the kill to the first
// login.
func killSSHD(t *testing.T, s *student) time.Duration {
	t.Helper()
	before := status(s.pod(), "workspace")
	killed := time.Now()
	// The user's own connection may or may not report the command's end
	// before the runtime kills what is left of the container.
	_, _ = s.run("pkill -9 -o -x sshd", nil)
	s.waitSSH(2 * time.Minute)
	n := time.Since(killed)
	// The kubelet reports the restart in the Pod's status a little later.
	stacktest.Eventually(t, time.Minute, func() (bool, string) {
		after := status(s.pod(), "workspace")
		return after.RestartCount == before.RestartCount+1 && containerID(after) != containerID(before) && after.State.Running != nil,
			fmt.Sprintf("workspace container: %d restarts (was %d), id %s (was %s); want one restart, a new container",
				after.RestartCount, before.RestartCount, containerID(after), containerID(before))
	})
	return n
}
