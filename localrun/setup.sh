#!/usr/bin/env bash
# Installs what labkeep needs on a fresh Debian machine, and only what is
# missing: it is safe and fast to run every time.
#   usage: localrun/setup.sh run|test   (`make run` passes run, `make test`
#   and `make bench` pass test; test is the default)
#   - run, as root: the Debian packages the local stack needs (PostgreSQL
#     server; for the local node: containerd, runc, the CNI plugins,
#     iproute2, iptables and ipset for kube-proxy and the NetworkPolicy
#     engine, unshare and nsenter, debootstrap for the workspace image;
#     for KubeVirt: gcc and the static C library for its container-disk
#     helper, qemu-img for the VM labs' guest disk);
#   - test adds what only tests use: OpenSSH server for the guardian
#     end-to-end tests, setpriv and procps, nginx and envsubst for the
#     reapTick forwarder test, kubectl for the kustomize check, qemu for the
#     cgroup v2 VM that guardian's scenarios also run in and for booting the
#     guest disk (xorriso makes its cloud-init ISO), chromium for the
#     portal's headless-browser tests;
#     packaged services are never started: tests run their own instances;
#   - both: the local Kubernetes binaries (etcd, kube-apiserver,
#     kube-controller-manager, kubelet, kube-scheduler, kube-proxy, CoreDNS,
#     kube-router's network policy controller, KubeVirt's components),
#     built once from the
#     Go module proxy and cached in $LABKEEP_BIN_CACHE (default: the user
#     cache dir), KubeVirt's CRDs (generated from kubevirt.io/kubevirt at
#     go.mod's kubevirt.io/api version, cached beside them) and, as root,
#     the node's images (cached beside them); test adds the kernel of the
#     cgroup v2 test VM (Debian's, unpacked, not installed).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-test}
case "$mode" in
  run | test) ;;
  *) echo "usage: $0 run|test (got \"$mode\")" >&2; exit 2 ;;
esac

need=()
have_cmd() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }
have_cmd initdb || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
have_cmd containerd || need+=(containerd)
have_cmd runc || need+=(runc)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
have_cmd ip || need+=(iproute2)
have_cmd iptables || need+=(iptables)
have_cmd ipset || need+=(ipset)
have_cmd debootstrap || need+=(debootstrap)
have_cmd unshare || need+=(util-linux)
have_cmd gcc || need+=(gcc)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || need+=(libc6-dev)
have_cmd qemu-img || need+=(qemu-utils)
have_cmd mkfs.ext4 || need+=(e2fsprogs)
if [ "$mode" = test ]; then
  have_cmd sshd || need+=(openssh-server)
  have_cmd setpriv || need+=(util-linux)
  have_cmd ps || need+=(procps)
  have_cmd nginx || need+=(nginx)
  have_cmd envsubst || need+=(gettext-base)
  have_cmd kubectl || need+=(kubectl)
  have_cmd qemu-system-x86_64 || need+=(qemu-system-x86)
  have_cmd xorrisofs || need+=(xorriso)
  have_cmd chromium || need+=(chromium)
fi

if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "labkeep setup ($mode): installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Keep packaged services (sshd on :22, nginx on :80, a PostgreSQL
    # cluster) from starting: policy-rc.d exit 101 = "action forbidden".
    policy=/usr/sbin/policy-rc.d
    if [ ! -e "$policy" ]; then
      printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
      trap 'rm -f "$policy"' EXIT
    fi
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "labkeep setup ($mode): missing ${need[*]} — install them (as root: apt-get install ${need[*]})" >&2
    exit 1
  fi
fi

go run ./localrun/cmd/labkeep-binaries -for "$mode" >/dev/null
