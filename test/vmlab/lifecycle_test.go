package vmlab_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"labkeep/localrun/stacktest"
	"labkeep/shared/reap"
	"labkeep/shared/session"
)

// guestProcesses returns the PIDs of the QEMU processes that run the guest
// of VirtualMachine vm in namespace ns: libvirt names the domain
// "<namespace>_<name>" and passes it to QEMU as -name guest=…. The node's
// processes are in a PID namespace below the host's, so the host's /proc
// sees them.
func guestProcesses(t *testing.T, ns, vm string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	want := []byte("guest=" + ns + "_" + vm + ",")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte("qemu-system")) {
			continue // gone meanwhile, or not QEMU
		}
		if bytes.Contains(cmdline, want) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// waitGuestRunning waits until the guest of the session's VM runs in a
// QEMU process on the node, and returns the VM's name.
func waitGuestRunning(t *testing.T, d *stacktest.Deployment, s stacktest.SessionView) string {
	t.Helper()
	vm := session.NodeName(s.ID, s.Nodes[0].Name)
	stacktest.Eventually(t, 5*time.Minute, func() (bool, string) {
		return len(guestProcesses(t, d.Namespace, vm)) == 1, "no QEMU process for " + d.Namespace + "/" + vm + "; session objects: " + fmt.Sprint(d.SessionObjects(s.ID))
	})
	return vm
}

// waitGuestStopped waits until no QEMU process runs the guest of vm.
func waitGuestStopped(t *testing.T, d *stacktest.Deployment, vm string) {
	t.Helper()
	stacktest.Eventually(t, 3*time.Minute, func() (bool, string) {
		left := guestProcesses(t, d.Namespace, vm)
		return len(left) == 0, fmt.Sprintf("QEMU of %s still runs: PIDs %v", vm, left)
	})
}

// With every labkeep process gone, the session's anchor alone stops the
// real guest at max lifetime + grace: the Job's deadline fails it, the TTL
// controller deletes it, the garbage collector deletes the VM it owns,
// KubeVirt shuts the guest down and its QEMU process ends. Nothing of
// labkeep runs meanwhile, so the row stays as it was.
func TestAnchorStopsTheRealGuest(t *testing.T) {
	const lifetime, grace = 100 * time.Second, 20 * time.Second
	d := deploy(t, stacktest.Options{Lifetime: lifetime, MaxLifetime: lifetime, DeadlineGrace: grace})
	ctx := context.Background()
	s := d.Opened("carol", "linux-vm")
	vm := waitGuestRunning(t, d, s)
	job, err := d.Kube.BatchV1().Jobs(d.Namespace).Get(ctx, session.AnchorName(s.ID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := int64((lifetime + grace) / time.Second); job.Spec.ActiveDeadlineSeconds == nil || *job.Spec.ActiveDeadlineSeconds != want {
		t.Fatalf("anchor deadline %v, want max lifetime + grace = %ds", job.Spec.ActiveDeadlineSeconds, want)
	}
	before := d.RowStatus(s.ID)
	d.Server.Close()
	d.App.Close()
	stopped := time.Now()

	stacktest.Eventually(t, 5*time.Minute, func() (bool, string) {
		left := d.SessionObjects(s.ID)
		return len(left) == 0, fmt.Sprintf("objects of the session left: %v", left)
	})
	waitGuestStopped(t, d, vm)
	t.Logf("functions stopped → VM and guest gone in %s (anchor deadline %s after its start)",
		time.Since(stopped).Round(100*time.Millisecond), lifetime+grace)
	if got := d.RowStatus(s.ID); got != before {
		t.Errorf("the row is %s, was %s when the functions stopped: something of labkeep ran", got, before)
	}
}

// A real guest holds its seat: with room for one VM, a second open is
// refused no_capacity; the namespace's VM quota counts the VM, and the
// real virt-launcher Pod (no activeDeadlineSeconds) stays out of the
// quota the Pod labs' workspaces are held to. When the session's time is
// up, the reaper stops the guest (its QEMU process ends) and the seat is
// free again.
func TestRealGuestHoldsItsSeatUntilReaped(t *testing.T) {
	d := deploy(t, stacktest.Options{MaxVMs: 1})
	ctx := context.Background()
	alice := d.Opened("alice", "linux-vm")
	vm := waitGuestRunning(t, d, alice)

	if r := d.Open("bob", "linux-vm"); r.Status != http.StatusServiceUnavailable || r.Code != "no_capacity" {
		t.Fatalf("second open with room for one VM = %d %s, want 503 no_capacity", r.Status, r.Body)
	}
	used := func(quota string, res corev1.ResourceName) int64 {
		t.Helper()
		q, err := d.Kube.CoreV1().ResourceQuotas(d.Namespace).Get(ctx, quota, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v := q.Status.Used[res]
		return v.Value()
	}
	stacktest.Eventually(t, time.Minute, func() (bool, string) {
		n := used("labkeep-vms", "count/virtualmachines.kubevirt.io")
		return n == 1, fmt.Sprintf("labkeep-vms counts %d VMs, want 1", n)
	})
	pods, err := d.Kube.CoreV1().Pods(d.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "kubevirt.io=virt-launcher"})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("virt-launcher Pods: %v, %v; want one", pods, err)
	}
	launcher := pods.Items[0]
	if launcher.Spec.ActiveDeadlineSeconds != nil {
		t.Errorf("virt-launcher Pod has activeDeadlineSeconds %d: it would count against labkeep-workspaces", *launcher.Spec.ActiveDeadlineSeconds)
	}
	if n := used("labkeep-workspaces", corev1.ResourcePods); n != 0 {
		t.Errorf("labkeep-workspaces counts %d Pods with only a VM lab running, want 0", n)
	}
	for _, c := range launcher.Spec.Containers {
		t.Logf("virt-launcher container %s requests %v, limits %v", c.Name, c.Resources.Requests, c.Resources.Limits)
	}

	d.Clock.Set(d.Session(alice.ID).MaxExpiresAt.Add(time.Minute))
	if r := d.Do("POST", "/reapTick", stacktest.SchedulerToken, "", ""); r.Status != http.StatusOK {
		t.Fatalf("reapTick = %d %s", r.Status, r.Body)
	}
	if got := d.RowStatus(alice.ID); got != session.StatusExpired {
		t.Errorf("the reaped row is %s, want %s", got, session.StatusExpired)
	}
	d.WaitGone(alice.ID)
	waitGuestStopped(t, d, vm)
	bob := d.Opened("bob", "linux-vm")
	if r := d.Close("bob"); r.Status != http.StatusOK {
		t.Fatalf("close bob = %d %s", r.Status, r.Body)
	}
	d.WaitGone(bob.ID)
}

// comesBackAfterPoweroff powers student's running guest off from inside
// and shows they get it back, and the reaper never takes the gap for a
// ghost: the VM's run strategy is Always, so KubeVirt replaces the ended
// VMI with a new one that boots the same disk in a new virt-launcher Pod,
// at a new address, which getSession gives (booting until ready). The
// reaper runs every few seconds throughout (its real rules: a missing VMI
// is a ghost only when looks at least AbsentConfirm apart both miss it);
// the session stays running, and the student logs in again with the same
// key and host key.
func comesBackAfterPoweroff(t *testing.T, d *stacktest.Deployment, student string, key ssh.Signer, running stacktest.SessionView) {
	t.Helper()
	ctx := context.Background()
	n := running.Nodes[0].SSH
	addr := net.JoinHostPort(n.Host, strconv.Itoa(n.Port))
	hosts := stacktest.StrictHosts(t, n.KnownHosts)
	vm := session.NodeName(running.ID, running.Nodes[0].Name)
	vmis := d.Dyn.Resource(stacktest.Resource("VirtualMachineInstance")).Namespace(d.Namespace)
	first, err := vmis.Get(ctx, vm, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The connection ends with the guest; its error says nothing.
	_, _ = stacktest.SSHRun(addr, n.User, key, hosts, "systemctl poweroff")
	off := time.Now()

	var back time.Duration
	var lastRun time.Time
	runs := 0
	phases := map[string]bool{}
	stacktest.Eventually(t, 10*time.Minute, func() (bool, string) {
		if time.Since(lastRun) >= 5*time.Second {
			rep, err := d.App.Reaper.RunOnce(ctx, reap.TriggerSchedule)
			if err != nil {
				t.Fatal(err)
			}
			lastRun = time.Now()
			runs++
			if rep.Counts[reap.Ghost] != 0 || len(rep.Failures) != 0 {
				t.Fatalf("reaper run %d, %s after the poweroff: counts %v failures %v items %v", runs, time.Since(off).Round(time.Second), rep.Counts, rep.Failures, rep.Items)
			}
		}
		cur, err := vmis.Get(ctx, vm, metav1.GetOptions{})
		if err != nil || cur.GetUID() == first.GetUID() {
			return false, fmt.Sprintf("no new VMI yet (%v)", err)
		}
		// The new guest runs in a new virt-launcher Pod, at a new address:
		// the student finds it where they found the first, in getSession.
		r := d.Do("GET", "/getSession", d.Token(student, "student"), "", "")
		if r.Status != http.StatusOK || r.Session.Status != "running" || len(r.Session.Nodes) != 1 {
			t.Fatalf("getSession after the poweroff = %d %s", r.Status, r.Body)
		}
		now := r.Session.Nodes[0]
		phases[now.Phase] = true
		if now.SSH.Host == n.Host {
			return false, fmt.Sprintf("new VMI %s; getSession still gives the old address %s (%s)", cur.GetUID(), n.Host, now.Phase)
		}
		addr := net.JoinHostPort(now.SSH.Host, strconv.Itoa(now.SSH.Port))
		out, err := stacktest.SSHRun(addr, n.User, key, stacktest.StrictHosts(t, now.SSH.KnownHosts), "id -u")
		if err != nil || out != "0" {
			return false, fmt.Sprintf("new VMI %s at %s (%s); login: %q %v", cur.GetUID(), addr, now.Phase, out, err)
		}
		if now.Phase != "ready" {
			return false, fmt.Sprintf("logged in at %s, phase still %s", addr, now.Phase)
		}
		back = time.Since(off)
		return true, ""
	})
	t.Logf("poweroff → a new VMI → login at its new address in %s; %d reaper runs meanwhile, no ghost; phases seen %v", back.Round(100*time.Millisecond), runs, phases)
	if !phases["booting"] {
		t.Errorf("getSession never said the node was booting again (phases %v)", phases)
	}
	if got := d.RowStatus(running.ID); got != session.StatusRunning {
		t.Errorf("the session is %s after the guest came back", got)
	}
}
