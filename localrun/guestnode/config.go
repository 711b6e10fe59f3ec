package guestnode

import (
	"fmt"

	"labkeep/localrun/controlplane"
	"labkeep/localrun/images"
	"labkeep/localrun/node"
)

// containerdConfig is containerd 1.6's config in the guest: state on the
// guest's own tmpfs, the CRI plugin with labkeep's sandbox image and the
// Pods' CNI network, runc with the cgroupfs driver (no systemd in the
// guest, as on many production nodes). Unlike the local node, oom_score_adj
// is not restricted: root in the guest holds CAP_SYS_RESOURCE. AppArmor is
// off (no apparmor_parser in the guest), and runc enters a container's
// root by chroot instead of pivot_root, which the kernel refuses on the
// guest's initramfs root.
var containerdConfig = fmt.Sprintf(`version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        NoPivotRoot = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/node/cni"
    max_conf_num = 1
`, images.Pause)

// cniConfig is the guest's Pod network: a bridge with the guest as the
// Pods' gateway and addresses from its subnet, nothing masqueraded (the
// host routes the subnet to the guest).
func cniConfig(l link) string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "labkeep",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "isDefaultGateway": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q}]],
        "dataDir": "/var/lib/cni"
      }
    }
  ]
}
`, l.podCIDR)
}

// kubeletConfig is the guest kubelet's KubeletConfiguration, a production
// node's but for: the cgroupfs driver (no systemd), no iptables chains (no
// iptables in the guest), anonymous access with every request allowed on
// the guest's address (the API server calls it without a client
// certificate, as on the local node) and the local nodes' images and
// eviction settings (node.KubeletImagesAndEviction).
func kubeletConfig(l link) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %q
port: 10250
readOnlyPort: 0
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
cgroupDriver: cgroupfs
failSwapOn: false
makeIPTablesUtilChains: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
resolvConf: /etc/resolv.conf
clusterDNS: [%q]
clusterDomain: %q
%smaxPods: 50
shutdownGracePeriod: 0s
`, l.guestIP, controlplane.ClusterDNSIP, controlplane.ClusterDomain, node.KubeletImagesAndEviction)
}

// startScript is the guest's command: the network, the node's tmpfs,
// containerd, the kubelet, the images; it then waits for the kubelet.
const startScript = `set -e
ip link set eth0 up
ip addr add "$NODE_IP/30" dev eth0
ip route add default via "$HOST_IP"
echo 1 > /proc/sys/net/ipv4/ip_forward
mkdir -p /var/lib /etc /var/log
mount -t tmpfs -o mode=0755 node-varlib /var/lib
cat /node/resolv.conf > /etc/resolv.conf
echo "$NODE_NAME" > /etc/hostname
echo "root:x:0:0:root:/root:/bin/sh" > /etc/passwd
echo "root:x:0:" > /etc/group
printf '127.0.0.1 localhost\n::1 localhost\n' > /etc/hosts
containerd --config /node/containerd.toml --log-level warn &
while [ ! -S /run/containerd/containerd.sock ]; do sleep 0.2; done
/usr/local/bin/kubelet --config=/node/kubelet-config.yaml --kubeconfig=/node/kubelet.kubeconfig \
  --root-dir=/var/lib/kubelet --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" \
  --node-labels="$NODE_LABELS" --register-with-taints="$NODE_TAINTS" --v=0 &
for a in $(cat /node/images.list); do ctr -n k8s.io images import --snapshotter overlayfs "$a" >/dev/null; done
echo "` + imagesImported + `"
wait
`
