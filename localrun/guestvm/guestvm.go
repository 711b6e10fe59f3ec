// Package guestvm boots a throwaway Linux VM under qemu's software
// emulation (TCG) with a cgroup v2-only kernel, runs one command in it and
// returns its output and exit code. It exists so that tests can exercise
// what only a real cgroup v2 kernel shows (memory.events, PSI,
// memory.oom.group, cgroup.kill, cgroup.freeze, cpu.max) on a host whose
// own cgroups are v1.
//
// The guest is a kernel and an initramfs, nothing else: the initramfs holds
// guestinit as /init, the host programs the command needs (with the shared
// libraries ldd names for them) and any files the caller adds. The kernel
// is Debian's linux-image-amd64, unpacked into the binary cache by
// localrun/setup.sh; it is booted with cgroup_no_v1=all so every
// controller lives on the unified hierarchy, as on a production node.
package guestvm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cavaliergopher/cpio"

	"labkeep/localrun/controlplane"
)

// ExitMarker precedes the command's exit code on the guest's console: the
// last thing guestinit prints before powering off.
const ExitMarker = "labkeep-guest-exit: "

// Qemu is the emulator; `-enable-kvm` is never used (it hangs on the
// machines this runs on), so the guest runs under TCG.
const Qemu = "qemu-system-x86_64"

// KernelDir is where, below the binary cache, setup.sh unpacks the kernel.
const KernelDir = "vm"

// KernelPackage is the Debian package whose dependency is the kernel the
// guest boots.
const KernelPackage = "linux-image-amd64"

// Kernel returns the kernel image in cache/vm, or an error saying how to
// get one.
func Kernel(cache string) (string, error) {
	matches, _ := filepath.Glob(filepath.Join(cache, KernelDir, "vmlinuz-*"))
	if len(matches) == 0 {
		return "", fmt.Errorf("no kernel in %s (`make test` runs labkeep-binaries, which unpacks Debian's %s there)", filepath.Join(cache, KernelDir), KernelPackage)
	}
	sort.Strings(matches)
	return matches[len(matches)-1], nil
}

// RequireKernel returns the cached kernel for a test: it skips the test
// when there is none, except under CI, where setup has fetched one and its
// absence is a failure.
func RequireKernel(t testing.TB) string {
	t.Helper()
	cache, err := controlplane.DefaultCacheDir(os.Getenv("LABKEEP_BIN_CACHE"))
	if err != nil {
		t.Fatal(err)
	}
	k, err := Kernel(cache)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	return k
}

// EnsureKernel returns the cached kernel, first downloading Debian's
// current kernel package and unpacking its image into cache/vm when there
// is none. The package is never installed: the host's own boot is not
// touched.
func EnsureKernel(ctx context.Context, cache string, progress io.Writer) (string, error) {
	if k, err := Kernel(cache); err == nil {
		return k, nil
	}
	out, err := exec.CommandContext(ctx, "apt-cache", "depends", KernelPackage).Output()
	if err != nil {
		return "", fmt.Errorf("apt-cache depends %s: %w", KernelPackage, err)
	}
	var pkg string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "Depends:" && strings.HasPrefix(f[1], "linux-image-") {
			pkg = f[1]
			break
		}
	}
	if pkg == "" {
		return "", fmt.Errorf("%s names no kernel package:\n%s", KernelPackage, out)
	}
	fmt.Fprintf(progress, "guestvm: fetching %s for the cgroup v2 test VM\n", pkg)
	x, cleanup, err := unpackPackage(ctx, pkg)
	if err != nil {
		return "", err
	}
	defer cleanup()
	images, _ := filepath.Glob(filepath.Join(x, "boot", "vmlinuz-*"))
	if len(images) != 1 {
		return "", fmt.Errorf("%s holds %d kernel images", pkg, len(images))
	}
	dst := filepath.Join(cache, KernelDir)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return "", err
	}
	final := filepath.Join(dst, filepath.Base(images[0]))
	return final, copyAtomic(images[0], final)
}

// unpackPackage downloads the Debian package pkg (never installing it) and
// unpacks it into a temp dir; cleanup removes both.
func unpackPackage(ctx context.Context, pkg string) (dir string, cleanup func(), err error) {
	tmp, err := os.MkdirTemp("", "guestvm-package-")
	if err != nil {
		return "", nil, err
	}
	cleanup = func() { os.RemoveAll(tmp) }
	dl := exec.CommandContext(ctx, "apt-get", "download", pkg)
	dl.Dir = tmp
	if b, err := dl.CombinedOutput(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("apt-get download %s: %v\n%s", pkg, err, b)
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		cleanup()
		return "", nil, fmt.Errorf("apt-get download %s left %d packages", pkg, len(debs))
	}
	x := filepath.Join(tmp, "x")
	if b, err := exec.CommandContext(ctx, "dpkg-deb", "-x", debs[0], x).CombinedOutput(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("dpkg-deb -x: %v\n%s", err, b)
	}
	return x, cleanup, nil
}

// copyAtomic copies src to dst through a file beside dst and a rename, so
// a half-written file is never found.
func copyAtomic(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.WriteFile(dst+".tmp", b, 0o644); err != nil {
		return err
	}
	return os.Rename(dst+".tmp", dst)
}

// Spec is one run of a guest.
type Spec struct {
	Kernel string
	// Init is guestinit, built for the host (static).
	Init string
	// Programs are host executables copied to the same path in the guest,
	// with the shared libraries they load.
	Programs []string
	// Files are extra host files: guest path → host path.
	Files map[string]string
	// Command and Env are what guestinit runs.
	Command []string
	Env     []string
	// Modules are kernel modules (host paths of .ko files, of the guest's
	// kernel) guestinit loads in this order before the command runs.
	Modules []string
	// Tap, if set, gives the guest a virtio network card on a tap device of
	// that name on the host, which qemu creates and removes with itself;
	// the host configures its end once it appears (see WaitLink).
	Tap string
	// MemoryMiB and CPUs size the VM (defaults: 3072 MiB, 2).
	MemoryMiB, CPUs int
	// Output receives everything the guest prints on its console.
	Output io.Writer
}

// Guest is a running VM (Start).
type Guest struct {
	cmd     *exec.Cmd
	dir     string
	pw      *io.PipeWriter
	scanned chan struct{}
	code    int
	ctx     context.Context
}

// Run builds the initramfs, boots the guest and returns the command's exit
// code. It fails when the guest ends without printing one (a kernel panic,
// a timeout from ctx).
func Run(ctx context.Context, s Spec) (int, error) {
	g, err := Start(ctx, s)
	if err != nil {
		return 0, err
	}
	return g.Wait()
}

// Start builds the initramfs and boots the guest; Wait returns its exit
// code, cancelling ctx stops it (qemu is killed).
func Start(ctx context.Context, s Spec) (*Guest, error) {
	if _, err := exec.LookPath(Qemu); err != nil {
		return nil, fmt.Errorf("%s not found (apt-get install qemu-system-x86): %w", Qemu, err)
	}
	dir, err := os.MkdirTemp("", "guestvm-")
	if err != nil {
		return nil, err
	}
	initrd := filepath.Join(dir, "initrd.cpio")
	if err := s.writeInitramfs(initrd); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initramfs: %w", err)
	}
	mem, cpus := s.MemoryMiB, s.CPUs
	if mem == 0 {
		mem = 3072
	}
	if cpus == 0 {
		cpus = 2
	}
	nic := []string{"-nic", "none"}
	if s.Tap != "" {
		nic = []string{"-netdev", "tap,id=n0,ifname=" + s.Tap + ",script=no,downscript=no", "-device", "virtio-net-pci,netdev=n0,romfile="}
	}
	args := append([]string{
		"-machine", "q35", "-cpu", "max", "-accel", "tcg,thread=multi",
		"-smp", strconv.Itoa(cpus), "-m", strconv.Itoa(mem),
		"-nographic", "-no-reboot"}, nic...)
	args = append(args,
		"-kernel", s.Kernel, "-initrd", initrd,
		"-append", "console=ttyS0 cgroup_no_v1=all psi=1 panic=-1 quiet loglevel=3 rdinit=/init")
	cmd := exec.CommandContext(ctx, Qemu, args...)
	// qemu dies with its owner, killed or not, and with it the guest (and
	// a tap it made).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 5 * time.Second
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	g := &Guest{cmd: cmd, dir: dir, pw: pw, scanned: make(chan struct{}), code: -1, ctx: ctx}
	go func() {
		defer close(g.scanned)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := strings.TrimRight(sc.Text(), "\r")
			if s.Output != nil {
				fmt.Fprintln(s.Output, line)
			}
			if rest, ok := strings.CutPrefix(line, ExitMarker); ok {
				if n, err := strconv.Atoi(strings.TrimSpace(rest)); err == nil {
					g.code = n
				}
			}
		}
		io.Copy(io.Discard, pr)
	}()
	return g, nil
}

// Wait waits for the guest to end and returns the command's exit code.
func (g *Guest) Wait() (int, error) {
	werr := g.cmd.Wait()
	g.pw.Close()
	<-g.scanned
	os.RemoveAll(g.dir)
	if g.code < 0 {
		if g.ctx.Err() != nil {
			return 0, fmt.Errorf("guest did not finish: %w", g.ctx.Err())
		}
		return 0, fmt.Errorf("guest ended without an exit code (qemu: %v)", werr)
	}
	return g.code, nil
}

// Exited reports whether qemu has ended.
func (g *Guest) Exited() bool { return g.cmd.ProcessState != nil }

// entry is one file of the initramfs.
type entry struct {
	mode   cpio.FileMode
	source string // host file for regular files
	data   []byte // contents when no source
	link   string // symlink target
}

func (s Spec) writeInitramfs(path string) error {
	if s.Init == "" || len(s.Command) == 0 {
		return errors.New("an init and a command are required")
	}
	files := map[string]entry{
		"/init":      {mode: cpio.TypeReg | 0o755, source: s.Init},
		"/guest/cmd": {mode: cpio.TypeReg | 0o644, data: []byte(strings.Join(s.Command, "\n") + "\n")},
		"/guest/env": {mode: cpio.TypeReg | 0o644, data: []byte(strings.Join(s.Env, "\n") + "\n")},
		// Debian's merged /usr, as on the host the programs come from.
		"/bin":   {mode: cpio.TypeSymlink | 0o777, link: "usr/bin"},
		"/sbin":  {mode: cpio.TypeSymlink | 0o777, link: "usr/sbin"},
		"/lib":   {mode: cpio.TypeSymlink | 0o777, link: "usr/lib"},
		"/lib64": {mode: cpio.TypeSymlink | 0o777, link: "usr/lib64"},
	}
	for _, d := range []string{"/dev", "/proc", "/sys", "/tmp", "/run", "/root", "/etc", "/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib64"} {
		files[d] = entry{mode: cpio.TypeDir | 0o755}
	}
	progs := append([]string(nil), s.Programs...)
	libs, err := sharedLibraries(progs)
	if err != nil {
		return err
	}
	for _, p := range append(progs, libs...) {
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			return err
		}
		files[guestPath(p)] = entry{mode: cpio.TypeReg | 0o755, source: real}
	}
	var order []string
	for i, m := range s.Modules {
		name := fmt.Sprintf("/guest/modules/%02d-%s", i, filepath.Base(m))
		files[name] = entry{mode: cpio.TypeReg | 0o644, source: m}
		order = append(order, name)
	}
	files["/guest/modules.order"] = entry{mode: cpio.TypeReg | 0o644, data: []byte(strings.Join(order, "\n") + "\n")}
	for g, h := range s.Files {
		st, err := os.Stat(h)
		if err != nil {
			return err
		}
		files[g] = entry{mode: cpio.TypeReg | cpio.FileMode(st.Mode().Perm()), source: h}
	}
	// Parent directories of everything, so the archive order never
	// matters to the kernel.
	for name := range files {
		for d := filepath.Dir(name); d != "/" && d != "."; d = filepath.Dir(d) {
			if _, ok := files[d]; !ok {
				files[d] = entry{mode: cpio.TypeDir | 0o755}
			}
		}
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	// Uncompressed: the kernel unpacks a plain cpio archive as well, and
	// gzip cost minutes here (hundreds of MB through a race-instrumented
	// compressor in the tests) and the emulated guest seconds to inflate.
	bw := bufio.NewWriterSize(f, 1<<20)
	w := cpio.NewWriter(bw)
	for _, n := range names {
		e := files[n]
		data := e.data
		if e.source != "" {
			if data, err = os.ReadFile(e.source); err != nil {
				return err
			}
		}
		if e.link != "" {
			data = []byte(e.link)
		}
		hdr := &cpio.Header{Name: strings.TrimPrefix(n, "/"), Mode: e.mode, Size: int64(len(data)), Links: 1}
		if e.mode.IsDir() {
			hdr.Size, hdr.Links = 0, 2
		}
		if err := w.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Size > 0 {
			if _, err := w.Write(data); err != nil {
				return err
			}
		}
	}
	if err := w.Close(); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return f.Close()
}

// guestPath maps a host path to where it lives in the guest: under /usr
// for the merged directories, so /bin/sh and /usr/bin/sh are one file.
func guestPath(p string) string {
	for _, d := range []string{"/bin/", "/sbin/", "/lib/", "/lib64/"} {
		if strings.HasPrefix(p, d) {
			return "/usr" + p
		}
	}
	return p
}

// sharedLibraries returns every library ldd lists for the programs
// (statically linked ones have none), with the dynamic loader.
func sharedLibraries(progs []string) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	for _, p := range progs {
		b, err := exec.Command("ldd", p).CombinedOutput()
		if err != nil {
			// ldd exits 1 for static executables.
			if bytes.Contains(b, []byte("not a dynamic executable")) {
				continue
			}
			return nil, fmt.Errorf("ldd %s: %w", p, err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			var lib string
			switch {
			case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
				lib = f[2]
			case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
				lib = f[0]
			}
			if lib != "" && !seen[lib] {
				seen[lib] = true
				out = append(out, lib)
			}
		}
	}
	return out, nil
}

// BuildInit compiles guestinit, statically, into dir and returns its path.
func BuildInit(ctx context.Context, dir string) (string, error) {
	out := filepath.Join(dir, "guestinit")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "labkeep/localrun/guestvm/guestinit")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build guestinit: %v\n%s", err, b)
	}
	return out, nil
}

// EnsureModules returns the host paths of the named kernel modules (file
// names without ".ko") of the cached kernel, in the order asked, first
// unpacking them from that kernel's Debian package into
// cache/vm/modules-<version> when any is missing. Only the modules named
// are kept (the package holds 390 MiB of them).
func EnsureModules(ctx context.Context, cache string, names []string) ([]string, error) {
	kernel, err := Kernel(cache)
	if err != nil {
		return nil, err
	}
	version := strings.TrimPrefix(filepath.Base(kernel), "vmlinuz-")
	dir := filepath.Join(cache, KernelDir, "modules-"+version)
	paths := func() ([]string, bool) {
		var out []string
		for _, n := range names {
			p := filepath.Join(dir, n+".ko")
			if _, err := os.Stat(p); err != nil {
				return nil, false
			}
			out = append(out, p)
		}
		return out, true
	}
	if out, ok := paths(); ok {
		return out, nil
	}
	pkg := "linux-image-" + version
	x, cleanup, err := unpackPackage(ctx, pkg)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	found := map[string]string{}
	root := filepath.Join(x, "lib", "modules", version)
	err = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".ko") {
			found[strings.TrimSuffix(d.Name(), ".ko")] = p
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	for _, n := range names {
		src, ok := found[n]
		if !ok {
			return nil, fmt.Errorf("%s holds no module %s", pkg, n)
		}
		if err := copyAtomic(src, filepath.Join(dir, n+".ko")); err != nil {
			return nil, err
		}
	}
	out, _ := paths()
	return out, nil
}
