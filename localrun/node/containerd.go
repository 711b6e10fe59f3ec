package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"labkeep/localrun/childproc"
	"labkeep/localrun/images"
)

// cniBinDir is where Debian's containernetworking-plugins puts the plugins.
const cniBinDir = "/usr/lib/cni"

// sbinPath is the PATH of the node's processes: containerd finds its shim
// and runc there, the kubelet its mount helpers.
const sbinPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func lookPath(tool string) (string, error) {
	for _, d := range filepath.SplitList(sbinPath) {
		p := filepath.Join(d, tool)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", exec.ErrNotFound
}

// containerdConfig is containerd 1.6's config: everything under the node
// dir, the CRI plugin with labkeep's sandbox image and CNI network, and no
// negative oom_score_adj (restrict_oom_score_adj caps the kubelet's -998
// for sandboxes and -997 for Guaranteed containers at containerd's own 0:
// this host's root lacks CAP_SYS_RESOURCE, and runc cannot start a
// container whose spec asks for less).
func (n *Node) containerdConfig() string {
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
temp = %[3]q
oom_score = 0
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = %[4]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[6]q
    conf_dir = %[7]q
    max_conf_num = 1
`, n.path("containerd", "root"), n.path("containerd", "state"), n.path("containerd", "tmp"),
		n.ContainerdSocket, images.Pause, cniBinDir, n.path("cni", "net.d"))
}

// cniConfig is the Pod network: the bridge in the node's network
// namespace (see network.go) with host-local addresses from the node's
// subnet, kept under the node dir. Pods route everything through the
// bridge's address (the node), and nothing is masqueraded: Pods reach each
// other, the node and the host, and nothing beyond.
func (n *Node) cniConfig() string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "labkeep",
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "isDefaultGateway": true,
      "ipMasq": false,
      "hairpinMode": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q, "rangeStart": %q}]],
        "dataDir": %q
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, podBridge, n.net.cidr, n.net.firstPodIP, n.path("cni", "ipam"))
}

// nodeMounts makes, in the node's mount namespace, the directories a
// node's own Pods may mount from the host its own: /run and /var/lib are
// tmpfs of the node's, and /var/lib/kubelet is the kubelet's directory
// (its $2). Every mount is shared in there, as on a systemd host (still a
// slave of the host's, so nothing propagates back), so a privileged Pod's
// mounts (KubeVirt's virt-handler mounts containerDisks into virt-launcher
// Pods through /var/lib/kubelet and /var/run/kubevirt, "Bidirectional")
// reach the Pods that mount them; containerd checks the propagation of
// the mount a host path lies on by its literal path (/var/run/... lies on
// "/", not on /run). Several nodes on one machine never see each other's.
const nodeMounts = `mount --make-rshared / &&
mount -t tmpfs -o mode=0755,size=64m labkeep-run /run && mount --make-rshared /run &&
mount -t tmpfs -o mode=0755,size=16m labkeep-varlib /var/lib && mount --make-rshared /var/lib &&
mkdir /var/lib/kubelet && mount --bind "$2" /var/lib/kubelet`

// startContainerd starts containerd as PID 1 of new PID and mount
// namespaces (see the package doc), in the node's new network namespace,
// which it then sets up (nodeNet.join): `unshare --kill-child` makes it die
// with unshare, which dies with this process (PDEATHSIG), and the kernel
// kills everything in the namespace when containerd ends. /run is a
// private tmpfs in there (shim sockets, runc state), so nothing of it lands
// in the host's /run/containerd.
//
// The kubelet mounts Pod volumes in the host's mount namespace; for
// containerd to see them its directory is made a shared mount first, which
// the namespace (propagation "slave") receives.
func (n *Node) startContainerd(ctx context.Context) error {
	n.ContainerdSocket = n.path("containerd.sock")
	for _, d := range []string{"containerd/root", "containerd/state", "containerd/tmp", "cni/net.d", "cni/ipam", "kubelet"} {
		if err := os.MkdirAll(n.path(d), 0o755); err != nil {
			return err
		}
	}
	if err := n.writeFiles(map[string]string{
		"containerd/config.toml":        n.containerdConfig(),
		"cni/net.d/10-labkeep.conflist": n.cniConfig(),
	}); err != nil {
		return err
	}
	kubeletDir := n.path("kubelet")
	if err := syscall.Mount(kubeletDir, kubeletDir, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount %s: %w", kubeletDir, err)
	}
	if err := syscall.Mount("", kubeletDir, "", syscall.MS_SHARED|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s shared: %w", kubeletDir, err)
	}
	if strings.HasPrefix(kubeletDir, "/var/lib/") || strings.HasPrefix(kubeletDir, "/run/") {
		return fmt.Errorf("the node's dir %s must not be under /var/lib or /run: the node has its own", n.Dir)
	}
	script := nodeMounts + ` && exec containerd --config "$1"`
	p, err := childproc.Start("containerd", n.path("containerd.log"), childproc.Attr{
		Env: []string{"PATH=" + sbinPath, "TMPDIR=" + n.path("containerd", "tmp"), "HOME=" + n.Dir},
	}, "unshare", "--mount", "--propagation=slave", "--pid", "--net", "--fork", "--kill-child", "--mount-proc",
		"--", "/bin/sh", "-c", script, "containerd", n.path("containerd", "config.toml"), kubeletDir)
	if err != nil {
		return err
	}
	n.procs = append(n.procs, p)
	n.netPid = p.Pid()
	if err := waitOwnNetns(ctx, n.netPid); err != nil {
		return fmt.Errorf("containerd's network namespace: %w; log:\n%s", err, p.LogTail(3000))
	}
	if err := n.net.join(n.netPid); err != nil {
		return err
	}
	for {
		if done, err := p.Exited(); done {
			return fmt.Errorf("containerd %w (%v); log:\n%s", childproc.ErrExited, err, p.LogTail(3000))
		}
		if _, err := os.Stat(n.ContainerdSocket); err == nil {
			if _, err := n.ctr(ctx, "version"); err == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("containerd not ready: %w; log:\n%s", ctx.Err(), p.LogTail(3000))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ctr runs containerd's CLI against this node's containerd, in the
// namespace the CRI plugin (and so the kubelet) uses.
func (n *Node) ctr(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "ctr", append([]string{"--address", n.ContainerdSocket, "--namespace", "k8s.io"}, args...)...)
	cmd.Env = []string{"PATH=" + sbinPath, "TMPDIR=" + n.path("containerd", "tmp")}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// importImages imports the archives (unpacked for the overlayfs
// snapshotter, as a pull would leave them) and checks containerd lists
// every name.
func (n *Node) importImages(ctx context.Context, archives []images.Archive) error {
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, len(archives))
	for i, a := range archives {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = n.ctr(ctx, "images", "import", "--snapshotter", "overlayfs", a.Path)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	out, err := n.ctr(ctx, "images", "list", "--quiet")
	if err != nil {
		return err
	}
	have := strings.Fields(out)
	for _, name := range images.Names(archives) {
		if !slices.Contains(have, name) {
			return fmt.Errorf("image %s missing after import (containerd has %v)", name, have)
		}
		n.Images = append(n.Images, name)
	}
	fmt.Fprintf(n.progress, "labkeep: imported %d images into the node's containerd in %s\n", len(n.Images), time.Since(start).Round(10*time.Millisecond))
	return nil
}
