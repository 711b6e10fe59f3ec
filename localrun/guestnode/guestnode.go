// Package guestnode runs a second, production-like Kubernetes node for
// tests: Debian's kernel under qemu (software emulation, package guestvm)
// with cgroup v2 only, containerd, runc and a kubelet inside, joined to
// the local control plane as V2NodeName. Unlike the local stack's node
// (package node), root there holds every capability and the Pods' cgroups
// are v2, each container in a private cgroup namespace: what a production
// node gives guardian.
//
// The guest reaches the host over a tap device qemu creates and removes
// with itself: the host is <prefix>.1 on it, the guest <prefix>.2, and the
// guest's Pods' subnet is routed to the guest, so the host (students' SSH,
// the functions' calls to guardian, the API server's to the kubelet)
// reaches Pods there as it reaches the local node's. The kubelet reaches
// the API server through a forwarder the host runs on its end of the tap.
// The node is tainted (TaintKey) and labelled (LabelKey): only Pods that
// ask for it run there. It has no cluster DNS, Service proxy or
// NetworkPolicy engine.
//
// Nothing outlives Stop or the owner: qemu dies with its owner
// (PDEATHSIG), which removes the tap and its routes; the Node object is
// deleted by Stop.
package guestnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"labkeep/localrun/controlplane"
	"labkeep/localrun/guestvm"
	"labkeep/localrun/images"
	"labkeep/localrun/node"
)

// LabelKey and TaintKey mark the node: Pods select it by the label and
// tolerate the taint (NoSchedule), and no other Pod lands there.
const (
	LabelKey = "labkeep.io/cgroup"
	TaintKey = "labkeep.io/cgroup-v2"
)

// PodImages are the images the node holds: a workspace Pod's.
var PodImages = []string{images.Pause, images.Guardian, images.Workspace}

// modules are the kernel modules the node needs, each after those it
// depends on: the virtio network card, the Pods' bridge and veths, and
// containerd's overlay snapshotter.
var modules = []string{
	"virtio_ring", "virtio", "virtio_pci_legacy_dev", "virtio_pci_modern_dev", "virtio_pci",
	"failover", "net_failover", "virtio_net",
	"llc", "stp", "bridge", "veth", "overlay",
}

// programs are the host executables the guest runs (with their shared
// libraries): the node's processes, the CNI plugins and what its start
// script and the kubelet call.
var programs = []string{
	"/bin/sh", "/usr/bin/mkdir", "/usr/bin/cat", "/usr/bin/sleep", "/usr/bin/mount", "/usr/bin/umount",
	"/usr/sbin/ip", "/usr/bin/containerd", "/usr/bin/containerd-shim-runc-v2", "/usr/sbin/runc", "/usr/bin/ctr",
	"/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/loopback",
}

// Options configures Start.
type Options struct {
	// ControlPlane is the cluster the node joins (required).
	ControlPlane *controlplane.ControlPlane
	// BinCache overrides the binary cache dir (LABKEEP_BIN_CACHE).
	BinCache string
	// CPUs and MemoryMiB size the guest (defaults 2 and 3072).
	CPUs, MemoryMiB int
	// Progress receives build and start-up messages and the guest's
	// console (nil = discard).
	Progress io.Writer
	// StartTimeout bounds the boot until the node is Ready with its images
	// (default 6 minutes: everything runs emulated).
	StartTimeout time.Duration
	// Scheduler starts a kube-scheduler on the host with the node, for a
	// control plane without one (a stack without the local node, which
	// runs the cluster's): Pods that only select the node, as the session
	// functions' do, are placed on it.
	Scheduler bool
}

// Node is a running guest node.
type Node struct {
	Name string
	// HostIP is the host's address on the tap, IP the guest's (the
	// node's InternalIP), PodCIDR its Pods' subnet.
	HostIP, IP, PodCIDR string
	// Images are the image names imported into its containerd.
	Images []string

	guest    *guestvm.Guest
	sched    *node.Scheduler // nil without Options.Scheduler
	cancel   context.CancelFunc
	api      net.Listener
	admin    *rest.Config
	dir      string
	console  *consoleLog
	stopOnce sync.Once
}

// Start boots the guest node and returns once it is Ready with its images
// imported. On error everything started is stopped.
func Start(ctx context.Context, opts Options) (n *Node, err error) {
	cp := opts.ControlPlane
	if cp == nil || cp.V2Node == nil {
		return nil, errors.New("guestnode: a running control plane is required")
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 6 * time.Minute
	}
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	cache, err := controlplane.DefaultCacheDir(opts.BinCache)
	if err != nil {
		return nil, err
	}
	bins, err := controlplane.EnsureBinaries(ctx, cache, controlplane.DefaultVersions, progress)
	if err != nil {
		return nil, err
	}
	kernel, mods, err := EnsureKernel(ctx, cache, progress)
	if err != nil {
		return nil, err
	}
	built, err := images.Build(ctx, images.Options{CacheDir: filepath.Join(cache, "images"), Progress: progress, CoreDNS: bins.CoreDNS})
	if err != nil {
		return nil, err
	}
	// A workspace Pod's images: importing under emulation is slow.
	var archives []images.Archive
	for _, a := range built {
		if slices.ContainsFunc(a.Names, func(name string) bool { return slices.Contains(PodImages, name) }) {
			archives = append(archives, a)
		}
	}
	dir, err := os.MkdirTemp("", "labkeep-guestnode-")
	if err != nil {
		return nil, err
	}
	n = &Node{Name: controlplane.V2NodeName, dir: dir, admin: cp.Admin, console: &consoleLog{}}
	defer func() {
		if err != nil {
			n.Stop()
			n = nil
		}
	}()
	// Built before the tap name is locked: a cold build takes minutes.
	init, err := guestvm.BuildInit(ctx, dir)
	if err != nil {
		return n, err
	}
	link, unlock, err := allocateLink()
	if err != nil {
		return n, err
	}
	unlocked := false
	release := func() {
		if !unlocked {
			unlocked = true
			unlock()
		}
	}
	defer release()
	n.HostIP, n.IP, n.PodCIDR = link.hostIP, link.guestIP, link.podCIDR

	// The API server listens on the host's loopback; the guest reaches it
	// through a forwarder on the host's end of the tap, at this port, from
	// once the tap is up.
	ports, err := controlplane.FreePorts(1)
	if err != nil {
		return n, err
	}
	apiAddr := net.JoinHostPort(link.hostIP, strconv.Itoa(ports[0]))
	files := map[string]string{}
	write := func(name, content string) error {
		p := filepath.Join(dir, name)
		files["/node/"+name] = p
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		return os.WriteFile(p, []byte(content), 0o600)
	}
	kc := rest.CopyConfig(cp.V2Node)
	kc.Host = "https://" + apiAddr
	kc.ServerName = "127.0.0.1" // the API server's certificate names its loopback address
	if err := controlplane.WriteKubeconfig(filepath.Join(dir, "kubelet.kubeconfig"), kc, "system:node:"+n.Name); err != nil {
		return n, err
	}
	files["/node/kubelet.kubeconfig"] = filepath.Join(dir, "kubelet.kubeconfig")
	for name, content := range map[string]string{
		"containerd.toml":         containerdConfig,
		"cni/10-labkeep.conflist": cniConfig(link),
		"kubelet-config.yaml":     kubeletConfig(link),
		"start.sh":                startScript,
		"resolv.conf":             "nameserver " + controlplane.ClusterDNSIP + "\n",
		"images.list":             strings.Join(archivePaths(archives), "\n") + "\n",
	} {
		if err := write(name, content); err != nil {
			return n, err
		}
	}
	for _, a := range archives {
		files[guestArchive(a)] = a.Path
		n.Images = append(n.Images, a.Names...)
	}
	files["/usr/local/bin/kubelet"] = bins.Kubelet
	gctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	out := io.MultiWriter(progress, n.console)
	n.guest, err = guestvm.Start(gctx, guestvm.Spec{
		Kernel: kernel, Init: init, Programs: programs, Files: files, Modules: mods,
		Tap: link.tap, CPUs: opts.CPUs, MemoryMiB: opts.MemoryMiB, Output: out,
		Command: []string{"/bin/sh", "/node/start.sh"},
		Env: []string{
			"NODE_NAME=" + n.Name, "NODE_IP=" + link.guestIP, "HOST_IP=" + link.hostIP, "POD_CIDR=" + link.podCIDR,
			"NODE_LABELS=" + LabelKey + "=v2", "NODE_TAINTS=" + TaintKey + "=true:NoSchedule",
		},
	})
	if err != nil {
		return n, err
	}
	ctx, cancelStart := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancelStart()
	err = link.configureHost(ctx, n.guest)
	release() // the tap exists (or never will): its name is taken
	if err != nil {
		return n, fmt.Errorf("%w; console:\n%s", err, n.console.tail(4000))
	}
	if n.api, err = forward(apiAddr, strings.TrimPrefix(cp.APIServerURL, "https://")); err != nil {
		return n, err
	}
	if opts.Scheduler {
		if n.sched, err = node.StartScheduler(cp, bins.Scheduler, dir); err != nil {
			return n, err
		}
	}
	if err := n.waitReady(ctx); err != nil {
		return n, err
	}
	if n.sched != nil {
		if err := n.sched.Wait(ctx); err != nil {
			return n, err
		}
	}
	return n, nil
}

// EnsureKernel returns the guest's kernel and the modules the node loads
// (see modules), fetching whichever the binary cache lacks.
func EnsureKernel(ctx context.Context, cache string, progress io.Writer) (kernel string, mods []string, err error) {
	if kernel, err = guestvm.EnsureKernel(ctx, cache, progress); err != nil {
		return "", nil, err
	}
	mods, err = guestvm.EnsureModules(ctx, cache, modules)
	return kernel, mods, err
}

// Console returns the end of the guest's console output (the node's
// processes log there), for failure messages.
func (n *Node) Console(bytes int) string { return n.console.tail(bytes) }

// waitReady returns once the Node object is Ready and the guest has
// imported every image (its start script says so on the console).
func (n *Node) waitReady(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(n.admin)
	if err != nil {
		return err
	}
	for {
		if n.guest.Exited() {
			return fmt.Errorf("guest node ended; console:\n%s", n.console.tail(6000))
		}
		nodeObj, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err == nil && node.Ready(nodeObj) && n.console.contains(imagesImported) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("guest node %s not Ready: %w; console:\n%s", n.Name, ctx.Err(), n.console.tail(6000))
		case <-time.After(time.Second):
		}
	}
}

// Stop powers the guest off (qemu is killed: everything in it goes with
// it, and with qemu the tap and its routes), deletes the Node object and
// removes the node's files. Safe to call more than once.
func (n *Node) Stop() error {
	if n == nil {
		return nil
	}
	var errs []error
	n.stopOnce.Do(func() {
		if n.sched != nil {
			n.sched.Stop()
		}
		if n.cancel != nil {
			n.cancel()
		}
		if n.guest != nil {
			n.guest.Wait()
		}
		if n.api != nil {
			n.api.Close()
		}
		if cs, err := kubernetes.NewForConfig(n.admin); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			zero := int64(0)
			if err := cs.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !strings.Contains(err.Error(), "not found") {
				errs = append(errs, err)
			}
		}
		errs = append(errs, os.RemoveAll(n.dir))
	})
	return errors.Join(errs...)
}

func archivePaths(archives []images.Archive) []string {
	var out []string
	for _, a := range archives {
		out = append(out, guestArchive(a))
	}
	return out
}

// guestArchive is where an image archive lies in the guest.
func guestArchive(a images.Archive) string { return "/node/images/" + filepath.Base(a.Path) }

// imagesImported is what the start script prints once containerd holds
// every image.
const imagesImported = "labkeep-guestnode: images imported"

// consoleLog keeps the guest's console output.
type consoleLog struct {
	mu sync.Mutex
	b  []byte
}

func (c *consoleLog) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.b = append(c.b, p...)
	if len(c.b) > 4<<20 {
		c.b = append([]byte(nil), c.b[len(c.b)-2<<20:]...)
	}
	return len(p), nil
}

func (c *consoleLog) contains(s string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Contains(string(c.b), s)
}

func (c *consoleLog) tail(n int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.b) > n {
		return string(c.b[len(c.b)-n:])
	}
	return string(c.b)
}
