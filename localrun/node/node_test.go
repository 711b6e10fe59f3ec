package node

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"labkeep/localrun/childproc"
	"labkeep/localrun/controlplane"
	"labkeep/localrun/images"
	"labkeep/localrun/poll"
)

// footprint is what a node has on the host while it runs.
type footprint struct {
	Dir, Link, CgroupRoot string
	Pids                  []int
}

func footprintOf(n *Node) footprint {
	return footprint{Dir: n.Dir, Link: n.Link, CgroupRoot: n.CgroupRoot, Pids: n.Pids()}
}

// netnsOnMachine lists the network namespaces the machine still has, by
// inode, each with what holds it (files of it): processes, and bind
// mounts (nsfs mounts whose root reads "net:[inode]") in this mount
// namespace. An inode names a namespace only while it lives: the kernel
// gives it to the next namespace made (netnsCookie tells them apart).
func netnsOnMachine() map[string][]nsHolder {
	held := map[string][]nsHolder{}
	procs, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	for _, p := range procs {
		if l, err := os.Readlink(p); err == nil {
			dir := filepath.Dir(filepath.Dir(p))
			cmd, _ := os.ReadFile(filepath.Join(dir, "cmdline"))
			held[l] = append(held[l], nsHolder{File: p, By: fmt.Sprintf("process %s (%s)", filepath.Base(dir), strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " ")))})
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[3], "net:[") {
				held[f[3]] = append(held[f[3]], nsHolder{File: f[4], By: "a mount at " + f[4]})
			}
		}
	}
	return held
}

// nsHolder is a file of a namespace and what keeps it.
type nsHolder struct{ File, By string }

// netnsCookie returns the cookie of the network namespace whose file is
// nsFile: unlike its inode, the kernel never gives a cookie to another
// namespace. This package's tests run beside others that make namespaces
// all the time, so a Pod's namespace's inode is soon another's.
func netnsCookie(nsFile string) (uint64, error) {
	s, err := openIn(nsFile, func() (*os.File, error) {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		return os.NewFile(uintptr(fd), "socket"), nil
	})
	if err != nil {
		return 0, err
	}
	defer s.Close()
	return unix.GetsockoptUint64(int(s.Fd()), unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
}

// assertGone fails unless nothing of fp is left: no process of its process
// groups or naming its dir, no cgroup, no link, no mount under its dir,
// no dir.
func assertGone(t *testing.T, fp footprint) {
	t.Helper()
	for _, pid := range fp.Pids {
		if syscall.Kill(-pid, 0) == nil {
			t.Errorf("process group %d still has processes", pid)
		}
	}
	if pids := processesNaming(fp.Dir); len(pids) > 0 {
		t.Errorf("processes still name %s: %v", fp.Dir, pids)
	}
	for _, h := range hierarchies() {
		if _, err := os.Stat(filepath.Join(h, fp.CgroupRoot)); err == nil {
			t.Errorf("cgroup %s%s still exists", h, fp.CgroupRoot)
		}
	}
	if l := LinkOf(fp.Dir); l != "" {
		t.Errorf("link %s of %s still exists", l, fp.Dir)
	}
	if mps := mountsUnder(fp.Dir); len(mps) > 0 {
		t.Errorf("mounts left: %v", mps)
	}
	if _, err := os.Stat(fp.Dir); err == nil {
		t.Errorf("dir %s still exists", fp.Dir)
	}
}

// processesNaming returns the pids whose command line mentions s (the
// containerd shims name the node's socket).
func processesNaming(s string) []int {
	var pids []int
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, c := range cmdlines {
		b, err := os.ReadFile(c)
		if err == nil && strings.Contains(string(b), s) {
			var pid int
			fmt.Sscanf(filepath.Base(filepath.Dir(c)), "%d", &pid)
			if pid != os.Getpid() {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

func startCP(t *testing.T, root string) *controlplane.ControlPlane {
	t.Helper()
	cp, err := controlplane.Start(context.Background(), controlplane.Options{TempRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	return cp
}

func tempRoot(t *testing.T) string {
	t.Helper()
	root, err := os.MkdirTemp("", "labkeep-nodetest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

// pod is a Pod of one container named "main".
func pod(name, image string, policy corev1.PullPolicy, res corev1.ResourceList) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr(int64(1)),
			Containers: []corev1.Container{{
				Name: "main", Image: image, ImagePullPolicy: policy,
				Resources: corev1.ResourceRequirements{Requests: res, Limits: res},
			}},
		},
	}
}

func ptr[T any](v T) *T { return &v }

// waitRunning waits until the Pod is Running and Ready, failing at once
// if one of its containers waits for a reason that will not go away.
func waitRunning(t *testing.T, cs kubernetes.Interface, n *Node, name string) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var p *corev1.Pod
	err := poll.Until(ctx, func() (bool, string) {
		var err error
		p, err = cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("pod %s: %v", name, err)
		}
		for _, c := range p.Status.ContainerStatuses {
			if w := c.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" {
				t.Fatalf("pod %s container %s waiting: %s %s", name, c.Name, w.Reason, w.Message)
			}
		}
		if p.Status.Phase == corev1.PodRunning {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					return true, ""
				}
			}
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			t.Fatalf("pod %s ended: %+v", name, p.Status)
		}
		return false, "pod " + name + " not running"
	})
	if err != nil {
		t.Fatalf("pod %s not running: %+v\nkubelet log:\n%s\ncontainerd log:\n%s", name, p.Status, n.LogTail("kubelet", 4000), n.LogTail("containerd", 4000))
	}
	return p
}

// The node registers and is Ready; every image it provides runs as a Pod
// without any pull (a Guaranteed Pod too, whose oom_score_adj containerd
// must cap); Pods get addresses on the node's bridge that the host
// reaches (the workspace's sshd answers on port 22); Services, the
// cluster DNS and NetworkPolicies work from and between Pods as on a
// production node; and Stop leaves no
// process, container, mount, cgroup, network interface, network namespace
// or temp dir behind.
func TestNodeRunsPodsAndLeavesNothing(t *testing.T) {
	root := tempRoot(t)
	cp := startCP(t, root)
	start := time.Now()
	n, err := Start(context.Background(), Options{ControlPlane: cp, TempRoot: root, Progress: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("node Ready %s after Start", time.Since(start).Round(10*time.Millisecond))
	fp := footprintOf(n)
	stopped := false
	defer func() {
		if !stopped {
			n.Stop()
		}
	}()
	if diff := cmp.Diff([]string{PauseImage, VirtLauncherImage, GuardianImage, images.CoreDNS, WorkspaceImage}, n.Images); diff != "" {
		t.Errorf("images (-want +got):\n%s", diff)
	}
	cs, err := kubernetes.NewForConfig(cp.Admin)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	small := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")}
	pods := []*corev1.Pod{
		pod("pause", PauseImage, "", small),
		pod("launcher", VirtLauncherImage, corev1.PullNever, nil),
		pod("workspace", WorkspaceImage, "", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")}),
		pod("client", WorkspaceImage, "", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")}),
	}
	pods[2].Labels = map[string]string{"app": "workspace"}
	pods[0].Spec.AutomountServiceAccountToken = ptr(true) // a projected token and kube-root-ca.crt, as virt-launcher Pods get
	for _, p := range pods {
		created := time.Now()
		if _, err := cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		running := waitRunning(t, cs, n, p.Name)
		t.Logf("pod %s (%s, QoS %s) Running %s after create, IP %s", p.Name, p.Spec.Containers[0].Image, running.Status.QOSClass, time.Since(created).Round(10*time.Millisecond), running.Status.PodIP)
		_, subnet, _ := net.ParseCIDR(n.PodCIDR)
		if !subnet.Contains(net.ParseIP(running.Status.PodIP)) {
			t.Errorf("pod %s IP %s not in %s", p.Name, running.Status.PodIP, n.PodCIDR)
		}
		if p.Name == "workspace" {
			if running.Status.QOSClass != corev1.PodQOSGuaranteed {
				t.Errorf("workspace QoS %s, want Guaranteed", running.Status.QOSClass)
			}
			assertSSHBanner(t, running.Status.PodIP)
		}
	}
	server := waitRunning(t, cs, n, "workspace")
	t.Run("Services and the cluster DNS work from a Pod", func(t *testing.T) {
		assertClusterNetwork(t, cp.Admin, cs, "client", server)
	})
	t.Run("NetworkPolicies are enforced", func(t *testing.T) {
		assertPolicyEnforced(t, cp.Admin, cs, "client", server)
	})
	t.Run("the API server calls a webhook behind a Service", func(t *testing.T) {
		assertWebhookReached(t, cs)
	})
	// The webhook's and the cluster DNS's Pods are the node's too.
	all, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Items) != len(pods)+2 {
		t.Fatalf("want the test's %d Pods, the webhook's and the cluster DNS's, have %d", len(pods), len(all.Items))
	}
	// What the Pods have on the host, to look for after Stop. Other nodes
	// may come and go meanwhile (parallel test binaries), so the checks
	// name this node's things rather than compare the whole machine.
	if len(processesNaming(n.Dir)) == 0 {
		t.Fatal("no containerd shim names the node dir: the leak check below would prove nothing")
	}
	veths, err := n.net.podLinks(n.netPid)
	if err != nil {
		t.Fatal(err)
	}
	podNetNS := map[string]uint64{} // inode: cookie
	hostNetNS, _ := os.Readlink("/proc/self/ns/net")
	nodeNetNS, _ := os.Readlink(netnsPath(n.netPid))
	if nodeNetNS == "" || nodeNetNS == hostNetNS {
		t.Fatalf("the node's network namespace %q is not its own (the host's is %s)", nodeNetNS, hostNetNS)
	}
	nodeCookie, err := netnsCookie(netnsPath(n.netPid))
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range cgroupProcs(n.CgroupRoot) {
		p := "/proc/" + pid + "/ns/net"
		if l, err := os.Readlink(p); err == nil && l != hostNetNS && l != nodeNetNS {
			c, err := netnsCookie(p)
			if errors.Is(err, fs.ErrNotExist) {
				continue // a process that ended since the listing
			}
			if err != nil {
				t.Fatal(err)
			}
			podNetNS[l] = c
		}
	}
	if len(veths) != len(all.Items) || len(podNetNS) != len(all.Items) {
		t.Fatalf("want a veth on the node's bridge and a network namespace per Pod, have veths %v, netns %v", veths, podNetNS)
	}

	stopStart := time.Now()
	if err := n.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	stopped = true
	t.Logf("node stopped in %s", time.Since(stopStart).Round(10*time.Millisecond))
	assertGone(t, fp)
	for ns, holders := range netnsOnMachine() {
		if _, pod := podNetNS[ns]; !pod && ns != nodeNetNS {
			continue
		}
		for _, h := range holders {
			c, err := netnsCookie(h.File)
			switch {
			case errors.Is(err, fs.ErrNotExist):
				continue // gone since the listing; another holder may not be
			case err != nil:
				t.Errorf("network namespace %s, held by %s: %v", ns, h.By, err)
			case ns == nodeNetNS && c == nodeCookie:
				t.Errorf("the node's network namespace %s (with its bridge and the Pods' veths) still exists, held by %s", ns, h.By)
			case ns != nodeNetNS && c == podNetNS[ns]:
				t.Errorf("a Pod's network namespace %s still exists, held by %s", ns, h.By)
			}
			break // one holder that opens tells
		}
	}
}

// assertSSHBanner connects to ip:22 from the host and reads sshd's
// greeting. The container is Running as soon as its entrypoint runs; sshd
// listens a moment later (after making a host key), so refused
// connections are retried until then.
func assertSSHBanner(t *testing.T, ip string) {
	t.Helper()
	var c net.Conn
	poll.Eventually(t, 30*time.Second, func() (bool, string) {
		var err error
		c, err = net.DialTimeout("tcp", net.JoinHostPort(ip, "22"), 5*time.Second)
		return err == nil, fmt.Sprintf("ssh to the workspace Pod: %v", err)
	})
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "SSH-2.0-OpenSSH") {
		t.Fatalf("workspace greeting %q, %v", line, err)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// The owner of a node is SIGKILLed with a Pod running: every process,
// containerd's shims and the Pod's containers included, dies with it, and
// the next Start (under the same temp root) removes the bridge, the cgroup
// root, the kubelet's mounts and the temp dir it left.
func TestOwnerKilledLeavesNothing(t *testing.T) {
	root := tempRoot(t)
	cmd, fp, err := childproc.StartOwner("TestHelperNodeOwner", []string{"LABKEEP_TEST_NODE_OWNER_ROOT=" + root},
		func(fp footprint) bool { return fp.Dir != "" })
	if err != nil {
		t.Fatal(err)
	}
	containers := cgroupProcs(fp.CgroupRoot)
	if len(containers) == 0 || len(processesNaming(fp.Dir)) == 0 {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("no container processes under %s: the check below would prove nothing", fp.CgroupRoot)
	}
	cmd.Process.Kill()
	cmd.Wait()

	// Processes die with their owner: wait until the kernel has reaped them.
	poll.Eventually(t, 30*time.Second, func() (bool, string) {
		naming, inCgroups := processesNaming(fp.Dir), cgroupProcs(fp.CgroupRoot)
		return len(naming) == 0 && len(inCgroups) == 0 && !groupsAlive(fp.Pids),
			fmt.Sprintf("processes outlive their owner: naming the dir %v, in the cgroups %v", naming, inCgroups)
	})
	sweepStale(root)
	assertGone(t, fp)
}

func groupsAlive(pids []int) bool {
	return slices.ContainsFunc(pids, func(pid int) bool { return syscall.Kill(-pid, 0) == nil })
}

// cgroupProcs lists the processes in any cgroup below root (memory
// hierarchy).
func cgroupProcs(root string) []string {
	var pids []string
	_ = filepath.WalkDir(filepath.Join(cgroupMount, "memory", root), func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "cgroup.procs" {
			b, _ := os.ReadFile(p)
			pids = append(pids, strings.Fields(string(b))...)
		}
		return nil
	})
	return pids
}

// TestHelperNodeOwner is not a test: TestOwnerKilledLeavesNothing runs the
// test binary again with this as the only test, as the owner to kill.
func TestHelperNodeOwner(t *testing.T) {
	root := os.Getenv("LABKEEP_TEST_NODE_OWNER_ROOT")
	if root == "" {
		t.Skip("helper process for TestOwnerKilledLeavesNothing")
	}
	cp := startCP(t, root)
	n, err := Start(context.Background(), Options{ControlPlane: cp, TempRoot: root, NoWorkspaceImage: true})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cp.Admin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods("default").Create(context.Background(), pod("pause", PauseImage, "", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRunning(t, cs, n, "pause")
	b, _ := json.Marshal(footprintOf(n))
	fmt.Printf("\n%s\n", b)
	time.Sleep(5 * time.Minute)
	n.Stop()
}
