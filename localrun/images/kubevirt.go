package images

import (
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"labkeep/localrun/kubevirt"
)

// KubeVirtImage is the name of KubeVirt's image of component (virt-api,
// virt-controller, virt-handler, virt-launcher) at version: the local
// images carry the names production pulls them by, so the objects of an
// installation need no local variant.
func KubeVirtImage(component, version string) string {
	return kubevirt.Registry + "/" + component + ":" + version
}

// The KubeVirt node image's recipe: Debian 12 with libvirt and QEMU from
// bookworm-backports (libvirt 11, QEMU 10; KubeVirt 1.7 ships libvirt 10.10
// and QEMU 9.1, bookworm itself has 9.0 and 7.2). Any change here changes
// the cache key.
const (
	// kubeVirtNodeDebian are installed by debootstrap (minbase):
	// virt-handler's tools (ip, nft, mount, ps) and virt-launcher's
	// (xorrisofs makes the cloud-init ISO, setcap for the monitor).
	kubeVirtNodeDebian = "iproute2,nftables,procps,util-linux,xorriso,libcap2-bin"
	// kubeVirtNodeBackports are installed from bookworm-backports.
	kubeVirtNodeBackports = "libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients qemu-system-x86 qemu-utils"
	kubeVirtNodeRecipe    = "1"
)

// virtqemudShim stands in for the modular QEMU daemon virt-launcher and
// the node labeller start (/usr/sbin/virtqemud): Debian builds libvirt
// without the modular daemons, and libvirtd is the same daemon with every
// installed driver in one process (only the QEMU driver is installed).
// It takes virtqemud's options (-f config, -d daemon) and serves on
// virtqemud's socket: as root on the system socket, which virsh finds
// without a URI; as virt-launcher's unprivileged user on the socket
// virt-launcher dials (/var/run/libvirt/virtqemud-sock), a link to the
// session daemon's socket in the same directory.
const virtqemudShim = `#!/bin/sh
# labkeep: virtqemud's interface over Debian's libvirtd (see localrun/images/kubevirt.go).
set -eu
conf=""
daemon=""
while [ $# -gt 0 ]; do
  case "$1" in
    -f|--config) conf="$2"; shift 2 ;;
    -d|--daemon) daemon="--daemon"; shift ;;
    *) shift ;;
  esac
done
mkdir -p /var/run/libvirt
run=/var/run/libvirt/labkeep-libvirtd.conf
if [ -n "$conf" ] && [ -r "$conf" ]; then cp "$conf" "$run"; else : > "$run"; fi
if [ "$(id -u)" != 0 ]; then
  echo 'unix_sock_dir = "/var/run/libvirt"' >> "$run"
  ln -sfn libvirt-sock /var/run/libvirt/virtqemud-sock
fi
exec /usr/sbin/libvirtd $daemon -f "$run"
`

// kubeVirtNodeKey is the cache key of the node image's Debian layer.
func kubeVirtNodeKey() string {
	h := sha256.New()
	for _, s := range []string{kubeVirtNodeRecipe, debianSuite, kubeVirtNodeDebian, kubeVirtNodeBackports} {
		fmt.Fprintf(h, "%d:%s", len(s), s)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// kubeVirtImages returns the archive of KubeVirt's images for b, building
// what the cache lacks. One archive holds two images that share both
// layers (Debian with libvirt and QEMU; KubeVirt's programs and files):
// virt-launcher and virt-handler run it as root (virt-launcher's Pods
// choose their own user), virt-api and virt-controller as user 1001, as
// KubeVirt's own images do (their Pods require a non-root user).
func kubeVirtImages(ctx context.Context, work, cache string, b kubevirt.Binaries, progress io.Writer) (Archive, error) {
	base, err := kubeVirtBaseLayer(ctx, work, cache, progress)
	if err != nil {
		return Archive{}, err
	}
	top := filepath.Join(work, "kubevirt-top")
	if err := kubeVirtTop(top, b); err != nil {
		return Archive{}, err
	}
	topTar := filepath.Join(work, "kubevirt-top.tar")
	if err := tarDir(ctx, top, topTar); err != nil {
		return Archive{}, err
	}
	baseSum, err := fileHash(base)
	if err != nil {
		return Archive{}, err
	}
	topSum, err := fileHash(topTar)
	if err != nil {
		return Archive{}, err
	}
	h := sha256.Sum256([]byte(b.Version + baseSum + topSum))
	path := filepath.Join(cache, "kubevirt-"+hex.EncodeToString(h[:])[:16]+".tar")
	names := map[string][]string{
		"root": {KubeVirtImage("virt-launcher", b.Version), KubeVirtImage("virt-handler", b.Version)},
		"1001": {KubeVirtImage("virt-api", b.Version), KubeVirtImage("virt-controller", b.Version)},
	}
	all := append(append([]string{}, names["root"]...), names["1001"]...)
	if exists(path) {
		return Archive{Path: path, Names: all}, nil
	}
	pruneArchives(cache, "kubevirt")
	var layers []v1.Layer
	for _, t := range []string{base, topTar} {
		l, err := tarball.LayerFromFile(t, tarball.WithCompressionLevel(gzip.BestSpeed), tarball.WithCompressedCaching)
		if err != nil {
			return Archive{}, err
		}
		layers = append(layers, l)
	}
	refs := map[name.Reference]v1.Image{}
	for user, ns := range names {
		img, err := mutate.AppendLayers(empty.Image, layers...)
		if err != nil {
			return Archive{}, err
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return Archive{}, err
		}
		cf = cf.DeepCopy()
		cf.Config = v1.Config{
			User:       user,
			WorkingDir: "/",
			Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"},
		}
		if user == "root" {
			cf.Config.User = ""
		}
		cf.OS, cf.Architecture = "linux", runtime.GOARCH
		cf.Created = v1.Time{Time: epoch}
		cf.History = nil
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			return Archive{}, err
		}
		for _, n := range ns {
			tag, err := name.NewTag(n)
			if err != nil {
				return Archive{}, err
			}
			refs[tag] = img
		}
	}
	tmp := path + ".partial"
	if err := tarball.MultiRefWriteToFile(tmp, refs); err != nil {
		os.Remove(tmp)
		return Archive{}, err
	}
	return Archive{Path: path, Names: all}, os.Rename(tmp, path)
}

// kubeVirtTop lays out the second layer: KubeVirt's programs in /usr/bin,
// the virtqemud stand-in, libvirt's log directory, virt-launcher's libvirt configuration and
// nsswitch.conf, relative /var/run and /var/lock links, and the qemu user (uid and gid 107) that virt-launcher's
// Pods and qemu.conf name.
func kubeVirtTop(root string, b kubevirt.Binaries) error {
	for src, dst := range map[string]string{
		b.API: "usr/bin/virt-api", b.Controller: "usr/bin/virt-controller",
		b.Handler: "usr/bin/virt-handler", b.Chroot: "usr/bin/virt-chroot",
		b.Launcher: "usr/bin/virt-launcher", b.LauncherMonitor: "usr/bin/virt-launcher-monitor",
		b.ContainerDisk: "usr/bin/container-disk", b.Freezer: "usr/bin/virt-freezer",
		b.Probe: "usr/bin/virt-probe", b.Tail: "usr/bin/virt-tail",
		b.NodeLabeller: "usr/bin/node-labeller.sh",
	} {
		if err := placeFile(src, filepath.Join(root, dst), 0o755); err != nil {
			return err
		}
	}
	for src, dst := range map[string]string{
		b.QEMUConf: "etc/libvirt/qemu.conf", b.VirtqemudConf: "etc/libvirt/virtqemud.conf", b.NSSwitch: "etc/nsswitch.conf",
	} {
		if err := placeFile(src, filepath.Join(root, dst), 0o644); err != nil {
			return err
		}
	}
	// virt-launcher-monitor starts virt-launcher with NET_BIND_SERVICE as
	// an ambient capability; virt-launcher's container runs as the qemu
	// user with no_new_privs, so the monitor has the capability in its
	// permitted set only through this file capability (as in KubeVirt's
	// image: cap_net_bind_service=+ep, a version 2 vfs_cap_data).
	netBindService := []byte{0x01, 0, 0, 0x02, 0, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	if err := syscall.Setxattr(filepath.Join(root, "usr/bin/virt-launcher-monitor"), "security.capability", netBindService, 0); err != nil {
		return fmt.Errorf("file capability of virt-launcher-monitor: %w", err)
	}
	shim := filepath.Join(root, "usr/sbin/virtqemud")
	if err := os.MkdirAll(filepath.Dir(shim), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(shim, []byte(virtqemudShim), 0o755); err != nil {
		return err
	}
	// libvirtd logs to /var/log/libvirt as root (the node labeller); the
	// Debian layer has no /var/log content.
	if err := os.MkdirAll(filepath.Join(root, "var/log/libvirt/qemu"), 0o755); err != nil {
		return err
	}
	// virt-handler reaches into a virt-launcher's files through
	// /proc/<pid>/root/var/run/…: an absolute link there (Debian's /var/run
	// -> /run) resolves against virt-handler's own root, not the
	// launcher's, and the serial console's socket is not found. KubeVirt's
	// images link relatively, as here.
	for link, target := range map[string]string{"var/run": "../run", "var/lock": "../run/lock"} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			return err
		}
	}
	home := filepath.Join(root, "home/qemu")
	if err := os.MkdirAll(home, 0o755); err != nil {
		return err
	}
	return os.Chown(home, 107, 107)
}

// placeFile copies src to dst with mode (parents made).
func placeFile(src, dst string, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	body, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.WriteFile(dst, body, mode); err != nil {
		return err
	}
	return os.Chmod(dst, mode)
}

// tarDir writes dir as a layer tar, reproducible as writeImage's except
// that files keep their owners: packages in the Debian layer own files
// as their users, and the qemu user owns its home.
func tarDir(ctx context.Context, dir, out string) error {
	tar := exec.CommandContext(ctx, "tar", "--create", "--file", out,
		"--directory", dir, "--sort=name", "--mtime=@0", "--clamp-mtime",
		"--numeric-owner", "--xattrs", "--format=posix",
		"--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
		".")
	if b, err := tar.CombinedOutput(); err != nil {
		return fmt.Errorf("tar %s: %w\n%s", dir, err, b)
	}
	return nil
}

// kubeVirtBaseLayer returns the cached Debian layer of the node image,
// building it when the cache has none for the current recipe (a few
// minutes): debootstrap as for the workspace image, then apt installs
// libvirt and QEMU from bookworm-backports in the new root (with the
// host's name resolution, maintainer scripts forbidden to start services),
// and the qemu user is added.
func kubeVirtBaseLayer(ctx context.Context, work, cache string, progress io.Writer) (string, error) {
	path := filepath.Join(cache, "kubevirt-base-"+kubeVirtNodeKey()+".layer.tar")
	if exists(path) {
		return path, nil
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return "", ErrNoDebootstrap
	}
	old, _ := filepath.Glob(filepath.Join(cache, "kubevirt-base-*.layer.tar"))
	for _, o := range old {
		os.Remove(o)
	}
	mirror := debianMirror("/etc/apt", debianSuite)
	fmt.Fprintf(progress, "labkeep: building KubeVirt's node image (once, a few minutes; Debian %s with libvirt and QEMU from %s-backports, %s)\n", debianSuite, debianSuite, mirror)
	root := filepath.Join(work, "kubevirt-root")
	if err := debootstrap(ctx, root, mirror, kubeVirtNodeDebian); err != nil {
		return "", err
	}
	sources := fmt.Sprintf("deb %s %s main\ndeb %[1]s %[2]s-backports main\n", mirror, debianSuite)
	for file, content := range map[string]string{"etc/apt/sources.list": sources} {
		if err := os.WriteFile(filepath.Join(root, file), []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	for _, f := range []string{"etc/hosts", "etc/resolv.conf"} {
		if err := placeFile("/"+f, filepath.Join(root, f), 0o644); err != nil {
			return "", err
		}
	}
	install := fmt.Sprintf("mount -t proc proc %s/proc && chroot %[1]s sh -c 'apt-get update -q && apt-get install -y -q --no-install-recommends -t %s-backports %s'", root, debianSuite, kubeVirtNodeBackports)
	if err := runBuildStep(ctx, "unshare", "--mount", "--propagation=private", "--pid", "--fork", "--kill-child", "sh", "-c", install); err != nil {
		return "", err
	}
	if err := runBuildStep(ctx, "chroot", root, "sh", "-c", "groupadd -g 107 qemu && useradd -u 107 -g 107 -d /home/qemu -s /bin/bash qemu"); err != nil {
		return "", err
	}
	for _, f := range []string{"etc/hosts", "etc/resolv.conf"} {
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			return "", err
		}
	}
	if err := trimRootfs(root); err != nil {
		return "", err
	}
	tmp := path + ".partial"
	if err := tarDir(ctx, root, tmp); err != nil {
		return "", err
	}
	return path, os.Rename(tmp, path)
}

// trimRootfs removes from a built root what no container needs or what
// differs from build to build (see normalizeRootfs).
func trimRootfs(root string) error {
	if err := removeGlobs(root, append([]string{"usr/share/locale/*"}, rootfsLeftovers...)); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(root, "etc/machine-id"), nil, 0o644)
}
