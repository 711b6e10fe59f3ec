package images

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/uuid"
	"golang.org/x/sys/unix"
)

// GuestDebian is the containerDisk image of the local VM labs: a bootable
// Debian 12 disk that KubeVirt runs as a VM's root disk (virtio bus) and
// that labkeep's per-session cloud-init (NoCloud or ConfigDrive) makes
// reachable as root over SSH. Its one layer holds GuestDiskPath and
// nothing else.
//
// Ownership: KubeVirt's documentation builds containerDisks with
// "ADD --chown=107:107", but writeImage writes every file as root (its
// reproducible tar flags), so the disk is root's with mode 0444 instead.
// KubeVirt 1.7 needs only that the file be readable by uid 107: the
// containerDisk container runs /usr/bin/container-disk (a static binary
// from virt-launcher's image, mounted over /usr/bin, as uid 107, with no
// capabilities) that only holds a socket open; virt-handler (root) finds
// the single file under /disk and bind-mounts it read-only into the
// virt-launcher Pod (or, with the ImageVolume feature, the kubelet mounts
// the image there), where QEMU, as uid 107, opens it as the read-only
// backing file of the VM's writable qcow2 overlay. So the image needs no
// entrypoint, no /usr/bin, no libc and no user: any other world-readable
// disk would do as well.
//
// The guest boots from SeaBIOS (extlinux on an MBR disk, one ext4
// partition labelled and mounted by UUID) with Debian's cloud kernel, which
// has virtio drivers but no SATA (AHCI) driver: its disks must use the
// virtio bus. The serial console (ttyS0) shows the kernel and a login
// prompt (labkeep's web terminal reads it); the first NIC is configured by
// DHCP (cloud-init's fallback network config, rendered for ifupdown, as
// KubeVirt's masquerade binding serves DHCP); qemu-guest-agent starts
// when the VM has the agent's channel (KubeVirt's default), with every
// command enabled (KubeVirt's accessCredentials use
// guest-ssh-add-authorized-keys, or guest-exec and guest-file-* where that
// fails).
const GuestDebian = "labkeep.local/containerdisks/debian:12"

// GuestDiskPath is the disk in GuestDebian, where KubeVirt looks for it
// when a containerDisk volume names no path: the one file under /disk.
const GuestDiskPath = "/disk/debian-12.qcow2"

// ErrNoQemuImg is returned when the guest disk must be built and qemu-img
// is not installed (the Debian package qemu-utils; localrun/setup.sh
// installs it).
var ErrNoQemuImg = errors.New("qemu-img not found (Debian package qemu-utils; run localrun/setup.sh)")

// The guest disk's recipe. Any change here changes the cache key, so the
// next GuestDisk rebuilds the image.
const (
	// guestPackages are installed on top of debootstrap's minbase. The
	// cloud kernel is a quarter of the generic one's size (no drivers for
	// physical hardware) and boots on QEMU's virtio devices. cloud-init
	// needs python3-cffi-backend and locales, which its dependencies do not
	// pull in; it pulls isc-dhcp-client, which ifupdown uses for DHCP (and
	// which writes /etc/resolv.conf, so no resolver daemon is needed).
	// extlinux and syslinux-common (mbr.bin) make the disk bootable and stay
	// in the guest, small, so it can reinstall its boot loader; udev and
	// dbus are a normal systemd system's (device names, hostnamectl).
	guestPackages = "linux-image-cloud-amd64,systemd-sysv,udev,dbus,cloud-init,openssh-server,qemu-guest-agent," +
		"python3-cffi-backend,locales,ifupdown,isc-dhcp-client,iproute2,netbase,sudo,extlinux,syslinux-common"
	// guestDiskSize is the disk's virtual size: the root file system takes
	// all of it but the first MiB (the MBR and the gap partitioning tools
	// leave), so a student has about 3 GiB free.
	guestDiskSize = 4 << 30
	// guestPartStart is the root partition's first sector (1 MiB).
	guestPartStart = 2048
	// guestKernelArgs is the kernel command line after root=UUID=...: the
	// serial console first, so the login prompt is on ttyS0, and the
	// screen's too (tty0, the kernel's /dev/console).
	guestKernelArgs = "ro console=ttyS0 console=tty0"
	// guestRecipe versions the steps below (bump it when they change in a
	// way the other constants do not show).
	guestRecipe = "1"
)

// guestExtlinuxConf is the boot loader's configuration (%s: the root file
// system's UUID, then guestKernelArgs). /vmlinuz and /initrd.img are the
// symlinks Debian's kernel packages keep pointing at the newest kernel, so
// a kernel upgraded in the guest boots next time without updating this
// file.
const guestExtlinuxConf = `SERIAL 0 115200
DEFAULT debian
PROMPT 0
TIMEOUT 0
LABEL debian
  LINUX /vmlinuz
  INITRD /initrd.img
  APPEND root=UUID=%s %s
`

// guestCloudCfg is read by cloud-init after Debian's cloud.cfg. Only the
// datasources KubeVirt provides (cloudInitNoCloud, cloudInitConfigDrive:
// both a local disk), so ds-identify never waits for a metadata service on
// the network; root may log in (labkeep's sessions are root's) by key only.
// The host keys the user data does not give are generated at first boot,
// before sshd starts: ed25519 only, as an RSA key takes seconds of an
// emulated CPU (labkeep gives the session's ed25519 key; OpenSSH and Go's
// x/crypto/ssh both speak ed25519).
const guestCloudCfg = `# labkeep guest disk
datasource_list: [NoCloud, ConfigDrive]
disable_root: false
ssh_pwauth: false
ssh_genkeytypes: [ed25519]
`

// guestSSHDConfig is read before Debian's sshd_config (first value wins).
const guestSSHDConfig = `# labkeep guest disk
PermitRootLogin prohibit-password
KbdInteractiveAuthentication no
`

// guestSSHDPwauth is the file cloud-init's ssh_pwauth writes (sshd reads
// it before guestSSHDConfig), with the value labkeep's user data asks for
// already in it: cloud-init restarts sshd when it changes the file, during
// its config stage, after sshd has started, and the restart resets every
// connection in progress (a student's first login, a readiness check).
const guestSSHDPwauth = "PasswordAuthentication no\n"

// guestFiles are written into the rootfs after debootstrap (%s in fstab:
// the root file system's UUID). An empty machine-id makes systemd generate
// one at first boot, so no two VMs share it; /etc/default/locale names the
// locale every Debian system has (C.UTF-8), so cloud-init's locale module
// does not run locale-gen at boot, which takes long under emulation. There
// is no /etc/resolv.conf: DHCP writes it.
var guestFiles = map[string]string{
	"etc/machine-id":                           "",
	"etc/hostname":                             "debian\n",
	"etc/default/locale":                       "LANG=C.UTF-8\n",
	"etc/fstab":                                "UUID=%s / ext4 errors=remount-ro 0 1\n",
	"etc/cloud/cloud.cfg.d/99_labkeep.cfg":     guestCloudCfg,
	"etc/ssh/sshd_config.d/labkeep.conf":       guestSSHDConfig,
	"etc/ssh/sshd_config.d/50-cloud-init.conf": guestSSHDPwauth,
	"boot/extlinux/extlinux.conf":              guestExtlinuxConf,
}

// guestRemove lists what the rootfs must not carry: what differs from build
// to build or VM to VM (host keys, which cloud-init writes at first boot;
// dbus's own machine-id; the build host's resolver), caches, package lists,
// documentation and translations, the build's policy-rc.d, and
// e2scrub_reap's start at boot (it removes e2scrub's leftover LVM
// snapshots, of which a VM without LVM has none, and takes seconds of the
// one emulated CPU while the guest boots).
var guestRemove = []string{
	"usr/sbin/policy-rc.d",
	"etc/systemd/system/multi-user.target.wants/e2scrub_reap.service",
	"etc/ssh/ssh_host_*",
	"etc/resolv.conf",
	"var/lib/dbus/machine-id",
	"var/cache/apt/*", "var/lib/apt/lists/*",
	"var/cache/ldconfig/aux-cache",
	"var/cache/debconf/*-old", "var/lib/dpkg/*-old",
	"usr/share/doc/*", "usr/share/man/*", "usr/share/info/*", "usr/share/locale/*",
	"dev/*", "run/*", "tmp/*", "proc/*", "sys/*",
}

// guestDiskKey is the cache key of the guest disk image: a hash of its
// whole recipe.
func guestDiskKey() string {
	h := sha256.New()
	parts := []string{guestRecipe, debianSuite, guestPackages, strconv.Itoa(guestDiskSize), strconv.Itoa(guestPartStart),
		guestKernelArgs, guestExtlinuxConf, GuestDiskPath}
	for _, p := range slices.Sorted(maps.Keys(guestFiles)) {
		parts = append(parts, p, guestFiles[p])
	}
	parts = append(parts, guestRemove...)
	for _, s := range parts {
		fmt.Fprintf(h, "%d:%s", len(s), s)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// GuestDisk returns the cached containerDisk archive, building it first when the cache has none for the current recipe.
//
// The build (a few minutes, once per recipe) needs root, debootstrap,
// unshare, mke2fs, qemu-img and a free loop device, and no network but the
// Debian mirror apt uses here: debootstrap's first stage downloads the
// packages, its second stage runs chrooted in new mount, PID and network
// namespaces (as workspaceImage's does), then the rootfs is written into
// an ext4 file system (mke2fs -d) on a loop device over the partition's
// extent of a sparse raw disk, extlinux installs itself there from the
// guest's own rootfs (mounted in a private mount namespace, so no mount
// outlives the build), and qemu-img converts the disk to a compressed
// qcow2. The loop device is attached with autoclear and held open by
// this process while the build uses it, so the kernel detaches it when the
// build ends, however it ends.
//
// Everything a build writes is under a fresh directory in work, so two
// builds never share a file or a device; callers writing the same cache
// serialize on its lock file as Build does (writeImage's temporary archive
// has a fixed name). The archive is reproducible as far as workspaceImage
// is: fixed mtimes, owners and config; the disk inside still carries its
// build's file times.
func GuestDisk(ctx context.Context, work, cache string, progress io.Writer) (Archive, error) {
	if progress == nil {
		progress = io.Discard
	}
	names := []string{GuestDebian}
	key := guestDiskKey()
	path := filepath.Join(cache, "guestdisk-"+key+".tar")
	if exists(path) {
		return Archive{Path: path, Names: names}, nil
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return Archive{}, ErrNoDebootstrap
	}
	if _, err := exec.LookPath("qemu-img"); err != nil {
		return Archive{}, ErrNoQemuImg
	}
	pruneArchives(cache, "guestdisk")
	dir, err := os.MkdirTemp(work, "guestdisk-")
	if err != nil {
		return Archive{}, err
	}
	defer os.RemoveAll(dir)

	mirror := debianMirror("/etc/apt", debianSuite)
	fmt.Fprintf(progress, "labkeep: building image %s (once, a few minutes; debootstrap %s from %s)\n", GuestDebian, debianSuite, mirror)
	start := time.Now()
	step := func(what string) {
		fmt.Fprintf(progress, "labkeep: image %s: %s (%s)\n", GuestDebian, what, time.Since(start).Round(time.Second))
	}
	fsUUID := uuid.NewSHA1(uuid.NameSpaceOID, []byte("labkeep guest disk "+key)).String()

	root := filepath.Join(dir, "root")
	if err := runBuildStep(ctx, "debootstrap", "--foreign", "--variant=minbase", "--include="+guestPackages, debianSuite, root, mirror); err != nil {
		return Archive{}, err
	}
	// Forbid maintainer scripts to start services (policy-rc.d "101").
	if err := os.WriteFile(filepath.Join(root, "usr/sbin/policy-rc.d"), []byte("#!/bin/sh\nexit 101\n"), 0o755); err != nil {
		return Archive{}, err
	}
	if err := runBuildStep(ctx, "unshare", "--mount", "--propagation=private", "--net", "--pid", "--fork", "--kill-child",
		"chroot", root, "/debootstrap/debootstrap", "--second-stage"); err != nil {
		return Archive{}, err
	}
	step("debootstrap done")
	if err := configureGuest(root, fsUUID); err != nil {
		return Archive{}, err
	}

	raw := filepath.Join(dir, "disk.raw")
	if err := makeGuestRaw(ctx, raw, root, fsUUID, key); err != nil {
		return Archive{}, err
	}
	step("raw disk done")

	layer := filepath.Join(dir, "layer")
	disk := filepath.Join(layer, GuestDiskPath)
	if err := os.MkdirAll(filepath.Dir(disk), 0o755); err != nil {
		return Archive{}, err
	}
	// Compressed (zlib, which every QEMU reads): a third of the plain
	// qcow2's size (132 against 363 MiB), and booting it to the login
	// prompt under TCG took the same QEMU CPU time (57-60 s both).
	if err := runBuildStep(ctx, "qemu-img", "convert", "-c", "-f", "raw", "-O", "qcow2", raw, disk); err != nil {
		return Archive{}, err
	}
	if err := os.Chmod(disk, 0o444); err != nil {
		return Archive{}, err
	}
	os.Remove(raw)
	step("qcow2 done")

	// No entrypoint: KubeVirt runs its own binary in the container (see
	// GuestDebian).
	if err := writeImage(ctx, dir, layer, path, v1.Config{}, names); err != nil {
		return Archive{}, err
	}
	step("archive written")
	return Archive{Path: path, Names: names}, nil
}

// configureGuest removes guestRemove from the rootfs and writes
// guestFiles, with the root file system's UUID where they name it. Log
// files go, their directories stay (journald keeps a persistent journal
// only where /var/log/journal exists).
func configureGuest(root, fsUUID string) error {
	for _, pattern := range guestRemove {
		matches, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			return err
		}
		for _, m := range matches {
			if err := os.RemoveAll(m); err != nil {
				return err
			}
		}
	}
	if err := filepath.WalkDir(filepath.Join(root, "var/log"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		return os.Remove(p)
	}); err != nil {
		return err
	}
	for p, content := range guestFiles {
		switch p {
		case "etc/fstab":
			content = fmt.Sprintf(content, fsUUID)
		case "boot/extlinux/extlinux.conf":
			content = fmt.Sprintf(content, fsUUID, guestKernelArgs)
		}
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// makeGuestRaw writes the bootable raw disk: an MBR with syslinux's boot
// code and one active Linux partition from guestPartStart to the end,
// holding an ext4 file system made from root (fixed UUID and directory
// hash seed, inode tables and journal initialized now, so the guest's
// kernel does not spend its first minutes zeroing them), with extlinux
// installed.
func makeGuestRaw(ctx context.Context, raw, root, fsUUID, key string) error {
	bootCode, err := os.ReadFile(filepath.Join(root, "usr/lib/syslinux/mbr/mbr.bin"))
	if err != nil {
		return err
	}
	f, err := os.OpenFile(raw, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	sig := sha256.Sum256([]byte("labkeep guest disk signature " + key))
	err = f.Truncate(guestDiskSize)
	if err == nil {
		err = writeMBR(f, bootCode, binary.LittleEndian.Uint32(sig[:4]), guestPartStart, guestDiskSize/512-guestPartStart)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}

	// The loop device spans the partition alone (an offset, not the
	// kernel's partition scan, which kernels built without MSDOS partition
	// support lack); extlinux reads the offset back from the loop device
	// for the boot sector's partition offset.
	loop, err := attachLoop(raw, guestPartStart*512, guestDiskSize-guestPartStart*512)
	if err != nil {
		return err
	}
	defer loop.Close() // the last reference: the kernel detaches the device (autoclear)
	if err := runBuildStep(ctx, "mke2fs", "-q", "-F", "-t", "ext4", "-O", "^64bit", "-L", "debian-root", "-U", fsUUID,
		"-E", "hash_seed="+fsUUID+",lazy_itable_init=0,lazy_journal_init=0", "-d", root, loop.Name()); err != nil {
		return err
	}
	// extlinux finds its device through /proc/mounts and /dev, so both are
	// mounted in the chroot; the mount namespace, and every mount in it,
	// ends with the script.
	mnt := filepath.Join(filepath.Dir(raw), "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		return err
	}
	const install = `set -eu
mount -t ext4 "$1" "$2"
mount --bind /dev "$2/dev"
mount -t proc proc "$2/proc"
chroot "$2" /usr/bin/extlinux --install /boot/extlinux
umount "$2/proc" "$2/dev" "$2"
`
	if err := runBuildStep(ctx, "unshare", "--mount", "--propagation=private", "--net", "--pid", "--fork", "--kill-child",
		"sh", "-c", install, "sh", loop.Name(), mnt); err != nil {
		return err
	}
	return nil
}

// writeMBR writes an MBR to the start of disk: bootCode (at most 440
// bytes, syslinux's mbr.bin, which boots the active partition), the disk
// signature, and one active partition of type 0x83 (Linux) from sector
// start, sectors long, its CHS fields computed for the usual 255 heads and
// 63 sectors per track (saturated beyond 1023 cylinders: BIOSes use the
// LBA fields).
func writeMBR(disk *os.File, bootCode []byte, signature uint32, start, sectors uint32) error {
	if len(bootCode) > 440 {
		return fmt.Errorf("boot code is %d bytes, more than an MBR's 440", len(bootCode))
	}
	var mbr [512]byte
	copy(mbr[:], bootCode)
	binary.LittleEndian.PutUint32(mbr[440:], signature)
	p := mbr[446:462]
	p[0] = 0x80
	copy(p[1:4], chs(start))
	p[4] = 0x83
	copy(p[5:8], chs(start+sectors-1))
	binary.LittleEndian.PutUint32(p[8:], start)
	binary.LittleEndian.PutUint32(p[12:], sectors)
	mbr[510], mbr[511] = 0x55, 0xAA
	_, err := disk.WriteAt(mbr[:], 0)
	return err
}

// chs is the 3-byte cylinder/head/sector address of an LBA sector.
func chs(lba uint32) []byte {
	const heads, spt = 255, 63
	c, h, s := lba/(heads*spt), (lba/spt)%heads, lba%spt+1
	if c > 1023 {
		c, h, s = 1023, 254, 63
	}
	return []byte{byte(h), byte(s) | byte(c>>8)<<6, byte(c)}
}

// attachLoop attaches size bytes of file from offset to a free loop device
// with autoclear, and returns the device opened: the kernel detaches it when
// the last reference (this file, a mount, a process using a partition)
// goes, so a build that fails or is killed leaves no loop device behind.
// Another process may take the free device first; the next one is tried.
func attachLoop(file string, offset, size int64) (*os.File, error) {
	backing, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer backing.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer ctl.Close()
	cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
	cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
	cfg.Info.Offset, cfg.Info.Sizelimit = uint64(offset), uint64(size)
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], file)
	var lastErr error
	for attempt := 0; attempt < 20; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("no free loop device: %w", err)
		}
		dev, err := openLoop(fmt.Sprintf("/dev/loop%d", n))
		if err != nil {
			return nil, err
		}
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if err == nil {
			return dev, nil
		}
		dev.Close()
		if !errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("attach %s to %s: %w", file, dev.Name(), err)
		}
		lastErr = err
	}
	return nil, fmt.Errorf("attach %s to a loop device: %w", file, lastErr)
}

// openLoop opens a loop device, waiting briefly for devtmpfs to create a
// node the kernel has just added.
func openLoop(path string) (*os.File, error) {
	for i := 0; ; i++ {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err == nil || !errors.Is(err, os.ErrNotExist) || i == 100 {
			return f, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}
