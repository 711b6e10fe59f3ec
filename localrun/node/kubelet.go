package node

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"labkeep/localrun/childproc"
	"labkeep/localrun/controlplane"
)

// kubeletConfig is the kubelet's KubeletConfiguration. The choices that
// differ from a production node, and why:
//   - cgroupfs driver under a cgroup root of the node's own (no systemd
//     here; several nodes may run at once);
//   - failSwapOn false, oomScoreAdj 0 (root here cannot lower
//     oom_score_adj), no iptables chains (nothing to protect on loopback,
//     and nothing left behind);
//   - it runs in the node's network namespace and listens only on the
//     node's address, which it registers as the node's InternalIP, and
//     trusts every caller there (the API server connects without a client
//     certificate); it reaches the API server through apiForward;
//   - image garbage collection is off (imported images cannot be pulled
//     again) and eviction thresholds are low (a shared build machine's
//     disk is often fuller than a node's).
func (n *Node) kubeletConfig(port int) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %q
port: %d
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
cgroupDriver: cgroupfs
cgroupRoot: %q
cgroupsPerQOS: true
enforceNodeAllocatable: ["pods"]
failSwapOn: false
oomScoreAdj: 0
makeIPTablesUtilChains: false
containerRuntimeEndpoint: %q
podLogsDir: %q
resolvConf: /etc/resolv.conf
clusterDNS: [%q]
clusterDomain: %q
%smaxPods: 250
shutdownGracePeriod: 0s
syncFrequency: 10s
fileCheckFrequency: 10s
nodeStatusReportFrequency: 10s
`, n.net.nodeIP, port, n.CgroupRoot, "unix://"+n.ContainerdSocket, n.path("pod-logs"), controlplane.ClusterDNSIP, controlplane.ClusterDomain, KubeletImagesAndEviction)
}

// KubeletImagesAndEviction is the part of a local kubelet's configuration
// every local node shares: image garbage collection off (imported images
// cannot be pulled again) and low eviction thresholds (a shared build
// machine's disk, or a guest's tmpfs, is often fuller than a node's).
const KubeletImagesAndEviction = `serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
`

// startKubelet starts the kubelet as the control plane's node identity, in
// the node's network, mount and PID namespaces (containerd's): its Pod
// volume mounts are the node's, gone with it, and what it keeps at fixed
// paths (the device plugins' sockets under /var/lib/kubelet, which
// KubeVirt's virt-handler registers with) is the node's own, as the
// directories of Pods' host paths are (see nodeMounts).
func (n *Node) startKubelet(ctx context.Context, cp *controlplane.ControlPlane, bin string) error {
	ports, err := controlplane.FreePorts(1)
	if err != nil {
		return err
	}
	kubeconfig := n.path("kubelet.kubeconfig")
	if err := controlplane.WriteKubeconfig(kubeconfig, cp.Node, "system:node:"+n.Name); err != nil {
		return err
	}
	if err := n.writeFiles(map[string]string{"kubelet-config.yaml": n.kubeletConfig(ports[0])}); err != nil {
		return err
	}
	p, err := childproc.Start("kubelet", n.path("kubelet.log"), childproc.Attr{Env: []string{"PATH=" + sbinPath, "HOME=" + n.Dir}},
		"nsenter", "--net="+netnsPath(n.netPid), "--mount="+nsPath(n.netPid, "mnt"), "--pid="+nsPath(n.netPid, "pid_for_children"), "--", bin,
		"--config="+n.path("kubelet-config.yaml"),
		"--kubeconfig="+kubeconfig,
		"--root-dir="+n.path("kubelet"),
		"--hostname-override="+n.Name,
		"--node-ip="+n.net.nodeIP,
		"--v=0")
	if err != nil {
		return err
	}
	n.procs = append(n.procs, p)
	return nil
}

// Scheduler is a kube-scheduler serving a control plane, for a cluster
// whose nodes run none: the local node starts one; a stack without it
// (the cgroup v2 guest node's tests) starts its own.
type Scheduler struct {
	proc      *childproc.Process
	healthURL string
}

// StartScheduler starts kube-scheduler (bin) as system:kube-scheduler
// against cp, its kubeconfig, certificates and log in dir; Wait tells when
// it serves.
func StartScheduler(cp *controlplane.ControlPlane, bin, dir string) (*Scheduler, error) {
	ports, err := controlplane.FreePorts(1)
	if err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(dir, "scheduler.kubeconfig")
	if err := controlplane.WriteKubeconfig(kubeconfig, cp.Scheduler, "system:kube-scheduler"); err != nil {
		return nil, err
	}
	p, err := childproc.Start("kube-scheduler", filepath.Join(dir, "kube-scheduler.log"), childproc.Attr{Env: []string{"PATH=" + sbinPath, "HOME=" + dir}}, bin,
		"--kubeconfig="+kubeconfig,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(ports[0]),
		"--cert-dir="+filepath.Join(dir, "scheduler-certs"),
		"--profiling=false",
		"--v=0")
	if err != nil {
		return nil, err
	}
	return &Scheduler{proc: p, healthURL: fmt.Sprintf("https://127.0.0.1:%d/healthz", ports[0])}, nil
}

// Wait polls the scheduler's /healthz (self-signed, on loopback) until it
// answers 200 or ctx ends.
func (s *Scheduler) Wait(ctx context.Context) error {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	if err := controlplane.WaitOK(ctx, hc, s.healthURL, "", nil); err != nil {
		return fmt.Errorf("kube-scheduler not healthy: %w; log:\n%s", err, s.proc.LogTail(3000))
	}
	return nil
}

// Stop stops the scheduler (SIGTERM, then SIGKILL after 10 s).
func (s *Scheduler) Stop() { s.proc.Stop(syscall.SIGTERM, 10*time.Second) }
