#!/usr/bin/env bash
# Installs what labkeep's tests and `make run` need on a fresh Debian machine,
# and only what is missing: it is safe and fast to run every time.
#   - as root: Debian packages (PostgreSQL server, OpenSSH server for the
#     guardian end-to-end tests, setpriv, procps, nginx and envsubst for the
#     reapTick forwarder test, kubectl for the kustomize check; for the local
#     node: containerd, runc, the CNI plugins, iproute2, iptables for the
#     portmap plugin, debootstrap for the workspace image; qemu for the
#     cgroup v2 VM that guardian's scenarios also run in; chromium for the
#     student portal's headless-browser tests); their packaged
#     services are never started: tests run their own instances;
#   - the local Kubernetes binaries (etcd, kube-apiserver,
#     kube-controller-manager, kubelet, kube-scheduler), built once from the
#     Go module proxy and cached in $LABKEEP_BIN_CACHE (default: the user
#     cache dir), KubeVirt's CRDs (generated from kubevirt.io/kubevirt at
#     go.mod's kubevirt.io/api version, cached beside them), the kernel of
#     the cgroup v2 test VM (Debian's, unpacked, not installed), and, as
#     root, the node's images (cached beside them).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
have_cmd() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }
have_cmd initdb || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
have_cmd sshd || need+=(openssh-server)
have_cmd setpriv || need+=(util-linux)
have_cmd ps || need+=(procps)
have_cmd nginx || need+=(nginx)
have_cmd envsubst || need+=(gettext-base)
have_cmd kubectl || need+=(kubectl)
have_cmd containerd || need+=(containerd)
have_cmd runc || need+=(runc)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
have_cmd ip || need+=(iproute2)
have_cmd iptables || need+=(iptables)
have_cmd debootstrap || need+=(debootstrap)
have_cmd unshare || need+=(util-linux)
have_cmd qemu-system-x86_64 || need+=(qemu-system-x86)
have_cmd chromium || need+=(chromium)

if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "labkeep setup: installing ${need[*]}"
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
    echo "labkeep setup: missing ${need[*]} — install them (as root: apt-get install ${need[*]})" >&2
    exit 1
  fi
fi

go run ./localrun/cmd/labkeep-binaries >/dev/null
