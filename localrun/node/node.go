// Package node runs the local stack's one Kubernetes node beside the control
// plane: containerd (with runc and the CNI plugins of Debian) in a temp dir
// of its own, a kubelet and kube-scheduler built from the control plane's
// Kubernetes version, and the images Pods use, built locally and imported
// into containerd because nothing can be pulled.
//
// Nothing outlives the node, even when its owner is SIGKILLed:
//   - every process is a childproc (PDEATHSIG process group);
//   - containerd is PID 1 of its own PID namespace, so when it dies the kernel
//     kills every shim and container it started, and it runs in its own mount
//     namespace (with a private /run), so every mount it made (rootfs
//     overlays, network namespaces) goes with it, and with them the Pods'
//     network namespaces and veths;
//   - what is left on the host (the bridge, the cgroup root, the kubelet's
//     volume mounts, the temp dir) is removed by Stop, or by the next Start
//     once the owner is gone (see sweepStale).
//
// The node has a network namespace of its own (see network.go): the Pods'
// bridge, the kubelet and whatever filters the node's traffic live there,
// and the host reaches the Pods through it. No Pod traffic can leave the
// machine.
package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"labkeep/localrun/childproc"
	"labkeep/localrun/controlplane"
	"labkeep/localrun/images"
	"labkeep/localrun/kubevirt"
	"labkeep/localrun/netpolicy"
)

// The images every node provides (see package images): Pods may name them
// with imagePullPolicy IfNotPresent or Never. A tag other than "latest"
// defaults to IfNotPresent; an image named with ":latest" (or no tag) needs
// the policy spelled out, or the kubelet tries, and fails, to pull it.
const (
	PauseImage        = images.Pause
	VirtLauncherImage = images.VirtLauncher
	GuardianImage     = images.Guardian
	WorkspaceImage    = images.Workspace
)

// Options configures Start.
type Options struct {
	// ControlPlane is the cluster the node joins (required).
	ControlPlane *controlplane.ControlPlane
	// Binaries gives Kubelet, Scheduler and Proxy; if empty, they come from
	// EnsureBinaries and BinCache.
	Binaries controlplane.Binaries
	// BinCache overrides the binary cache dir (LABKEEP_BIN_CACHE); images
	// are cached in its "images" subdirectory.
	BinCache string
	// TempRoot is where the node's temp dir is made ("" = os.TempDir).
	TempRoot string
	// NoWorkspaceImage leaves the Debian workspace image out (about a
	// minute to build on a cold cache, a few seconds to import).
	NoWorkspaceImage bool
	// Progress receives build and start-up messages (nil = discard).
	Progress io.Writer
	// StartTimeout bounds the start-up after the builds (default 2
	// minutes; KubeVirt's installation has kubeVirtTimeout of its own).
	StartTimeout time.Duration
	// KubeVirt runs real KubeVirt on the node, guests under software
	// emulation (see package kubevirt): its images are built (minutes on
	// a cold cache) and imported, and Start returns once virt-handler has
	// marked the node schedulable for VMs.
	KubeVirt bool
}

// Node is a running node.
type Node struct {
	// Name is the Node object's name (controlplane.NodeName).
	Name string
	// Dir holds the node's state, sockets, configs and logs; Stop removes it.
	Dir string
	// Link is the host's end of the node's link (labkeep<i>); HostIP the
	// host's address on it, where Pods reach the host; IP the node's
	// address (its InternalIP, the kubelet's); PodCIDR the Pods' subnet,
	// routed from the host through the node.
	Link    string
	HostIP  string
	IP      string
	PodCIDR string
	// ContainerdSocket is containerd's gRPC socket (for ctr/crictl).
	ContainerdSocket string
	// CgroupRoot is the kubelet's cgroup root (same path in every v1
	// hierarchy); the Pods' cgroups are below <CgroupRoot>/kubepods.
	CgroupRoot string
	// Images are the image names imported into containerd.
	Images []string

	progress  io.Writer
	net       *nodeNet
	netPid    int         // a process in the node's network namespace (containerd's unshare)
	api       *apiForward // the API server, inside that namespace
	scheduler *Scheduler  // also in procs
	procs     []*childproc.Process
	// stopVolumes ends the volume provisioner (startVolumes), which runs
	// in this process.
	stopVolumes context.CancelFunc
	stopOnce    sync.Once
	stopErr     error
}

// Start starts a node joined to opts.ControlPlane and returns once it is
// Ready with every image imported. On error everything started is stopped.
func Start(ctx context.Context, opts Options) (n *Node, err error) {
	cp := opts.ControlPlane
	if cp == nil || cp.Node == nil {
		return nil, errors.New("node: a running control plane is required")
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 2 * time.Minute
	}
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	cache, err := controlplane.DefaultCacheDir(opts.BinCache)
	if err != nil {
		return nil, err
	}
	if opts.Binaries.Kubelet == "" || opts.Binaries.Scheduler == "" || opts.Binaries.Proxy == "" || opts.Binaries.CoreDNS == "" {
		if opts.Binaries, err = controlplane.EnsureBinaries(ctx, cache, controlplane.DefaultVersions, progress); err != nil {
			return nil, err
		}
	}
	engine, err := netpolicy.EnsureEngine(ctx, cache, controlplane.DefaultVersions, progress)
	if err != nil {
		return nil, err
	}
	var virt *kubevirt.Binaries
	if opts.KubeVirt {
		b, err := kubevirt.EnsureBinaries(ctx, cache, controlplane.DefaultVersions, progress)
		if err != nil {
			return nil, err
		}
		virt = &b
	}
	for _, tool := range []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc", "unshare", "nsenter", "tar", "iptables", "ipset"} {
		if _, err := lookPath(tool); err != nil {
			return nil, fmt.Errorf("node: %s not found (localrun/setup.sh installs it): %w", tool, err)
		}
	}
	if _, err := os.Stat(filepath.Join(cniBinDir, "bridge")); err != nil {
		return nil, fmt.Errorf("node: CNI plugins not found in %s (localrun/setup.sh installs containernetworking-plugins): %w", cniBinDir, err)
	}

	// Images build (from Go's build cache and the image cache) while the
	// node's processes start.
	type built struct {
		archives []images.Archive
		err      error
	}
	imgc := make(chan built, 1)
	go func(ctx context.Context) {
		a, err := images.Build(ctx, images.Options{CacheDir: filepath.Join(cache, "images"), Progress: progress, NoWorkspace: opts.NoWorkspaceImage, CoreDNS: opts.Binaries.CoreDNS, KubeVirt: virt})
		imgc <- built{a, err}
	}(ctx)
	imagesTaken := false
	defer func() {
		if err != nil && !imagesTaken {
			<-imgc // never leave a build running behind a failed start
		}
	}()

	sweepStale(opts.TempRoot)
	dir, err := childproc.TempDir(opts.TempRoot, dirPrefix)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	n = &Node{Name: controlplane.NodeName, Dir: dir, progress: progress}
	n.CgroupRoot = "/" + filepath.Base(dir)
	defer func() {
		if err != nil {
			n.Stop()
			n = nil
		}
	}()
	outer := ctx
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	started := time.Now()

	if n.net, err = allocateNet(dir); err != nil {
		return n, err
	}
	n.Link, n.HostIP, n.IP, n.PodCIDR = n.net.name, n.net.hostIP, n.net.nodeIP, n.net.cidr
	if err := makeCgroupRoot(n.CgroupRoot); err != nil {
		return n, err
	}
	if err := n.startContainerd(ctx); err != nil {
		return n, err
	}
	api, err := url.Parse(cp.Node.Host)
	if err != nil {
		return n, err
	}
	_, apiPort, err := net.SplitHostPort(api.Host)
	if err != nil {
		return n, err
	}
	if n.api, err = forwardAPI(n.netPid, api.Host, api.Host, net.JoinHostPort(n.net.gateway, apiPort)); err != nil {
		return n, err
	}
	cs, err := kubernetes.NewForConfig(cp.Admin)
	if err != nil {
		return n, err
	}
	if err := n.publishAPI(ctx, cs, api.Host); err != nil {
		return n, err
	}
	b := <-imgc
	imagesTaken = true
	if b.err != nil {
		return n, b.err
	}
	// The rest has StartTimeout of its own: the image builds may have
	// taken minutes on a cold cache.
	ctx, cancelRest := context.WithTimeout(outer, opts.StartTimeout)
	defer cancelRest()
	if err := n.importImages(ctx, b.archives); err != nil {
		return n, err
	}
	if err := n.startKubelet(ctx, cp, opts.Binaries.Kubelet); err != nil {
		return n, err
	}
	sched, err := StartScheduler(cp, opts.Binaries.Scheduler, n.Dir)
	if err != nil {
		return n, err
	}
	n.procs = append(n.procs, sched.proc) // Stop goes through procs in reverse: scheduler, kubelet, containerd
	n.scheduler = sched
	if err := n.startProxy(ctx, cp, opts.Binaries.Proxy); err != nil {
		return n, err
	}
	if err := n.waitReady(ctx, cp); err != nil {
		return n, err
	}
	if err := n.scheduler.Wait(ctx); err != nil {
		return n, err
	}
	// The engine finds its Node by name: only once the kubelet has
	// registered it, and before any Pod but the cluster DNS's.
	if err := n.startPolicyEngine(ctx, cp, cs, engine); err != nil {
		return n, err
	}
	if err := n.startDNS(ctx, cs); err != nil {
		return n, err
	}
	if err := n.startVolumes(ctx, cp, cs); err != nil {
		return n, err
	}
	if virt != nil {
		// Its own time: the image builds before it may have taken most of
		// StartTimeout on a cold cache.
		ctx, cancel := context.WithTimeout(outer, kubeVirtTimeout)
		defer cancel()
		if err := kubevirt.Install(ctx, cp.Admin, *virt, n.Name, true, progress); err != nil {
			return n, err
		}
	}
	fmt.Fprintf(progress, "labkeep: node %s Ready in %s (at %s, Pods on %s, host link %s)\n", n.Name, time.Since(started).Round(10*time.Millisecond), n.IP, n.PodCIDR, n.Link)
	return n, nil
}

// HostSource is the host's address on the node's link as a CIDR: where,
// on this machine, students' SSH and the functions' calls to guardian
// reach the node's Pods from (both run on the host). Sessions' policies
// must name it (LABKEEP_SSH_SOURCE_CIDRS, LABKEEP_PLATFORM_SOURCE_CIDRS):
// it lies in a range they block.
func (n *Node) HostSource() string { return n.HostIP + "/32" }

// kubeVirtTimeout bounds KubeVirt's installation on a started node (about
// 30 s here).
const kubeVirtTimeout = 4 * time.Minute

// dirPrefix names the node's temp dir, its cgroup root and (in the
// bridge's alias) its owner, so sweepStale can recognise leftovers.
const dirPrefix = "labkeep-node"

// waitReady returns once the Node object exists, is Ready and has lost the
// not-ready taint the kubelet registers it with (the node lifecycle
// controller removes it): from then on Pods are scheduled to it.
func (n *Node) waitReady(ctx context.Context, cp *controlplane.ControlPlane) error {
	cs, err := kubernetes.NewForConfig(cp.Admin)
	if err != nil {
		return err
	}
	for {
		for _, p := range n.procs {
			if done, err := p.Exited(); done {
				return fmt.Errorf("%s %w (%v); log:\n%s", p.Name, childproc.ErrExited, err, p.LogTail(3000))
			}
		}
		node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err == nil && Ready(node) && !hasNotReadyTaint(node) {
			return nil
		}
		select {
		case <-ctx.Done():
			why := "not registered"
			if node != nil {
				why = fmt.Sprintf("conditions %v, taints %v", node.Status.Conditions, node.Spec.Taints)
			}
			return fmt.Errorf("node %s not Ready (%s): %w; kubelet log:\n%s", n.Name, why, ctx.Err(), n.LogTail("kubelet", 3000))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func hasNotReadyTaint(node *corev1.Node) bool {
	for _, t := range node.Spec.Taints {
		if t.Key == corev1.TaintNodeNotReady {
			return true
		}
	}
	return false
}

// Ready reports whether node's Ready condition is true.
func Ready(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Stop stops the scheduler, the kubelet and containerd (and with it every
// container and the node's network namespace), then removes what they left
// on the host: the host's end of the node's link, the kubelet's mounts,
// the cgroup root and the temp dir. It is safe to call more than once and on a partly started node;
// errors name what could not be removed.
func (n *Node) Stop() error {
	if n == nil {
		return nil
	}
	n.stopOnce.Do(func() {
		var errs []error
		if n.stopVolumes != nil {
			n.stopVolumes()
		}
		for i := len(n.procs) - 1; i >= 0; i-- {
			n.procs[i].Stop(syscall.SIGTERM, 10*time.Second)
		}
		n.api.close()
		if n.net != nil {
			errs = append(errs, n.net.remove())
		}
		errs = append(errs, unmountUnder(n.Dir))
		if n.CgroupRoot != "" {
			errs = append(errs, removeCgroupRoot(n.CgroupRoot))
		}
		if n.Dir != "" {
			errs = append(errs, os.RemoveAll(n.Dir))
		}
		n.stopErr = errors.Join(errs...)
	})
	return n.stopErr
}

// Pids returns the process ids (process group leaders) of the node's
// processes, for leak checks.
func (n *Node) Pids() []int {
	var pids []int
	for _, p := range n.procs {
		pids = append(pids, p.Pid())
	}
	return pids
}

// LogTail returns the end of the named component's log ("containerd",
// "kubelet", "kube-scheduler"), for test failure messages.
func (n *Node) LogTail(component string, bytes int64) string {
	for _, p := range n.procs {
		if p.Name == component {
			return p.LogTail(bytes)
		}
	}
	return ""
}

func (n *Node) path(elem ...string) string {
	return filepath.Join(append([]string{n.Dir}, elem...)...)
}

// writeFiles writes each path (relative to the node dir) with its content.
func (n *Node) writeFiles(files map[string]string) error {
	for p, c := range files {
		full := n.path(p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if strings.HasSuffix(p, "kubeconfig") {
			mode = 0o600
		}
		if err := os.WriteFile(full, []byte(c), mode); err != nil {
			return err
		}
	}
	return nil
}
