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
	"compress/gzip"
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
	tmp, err := os.MkdirTemp("", "guestvm-kernel-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	dl := exec.CommandContext(ctx, "apt-get", "download", pkg)
	dl.Dir = tmp
	if b, err := dl.CombinedOutput(); err != nil {
		return "", fmt.Errorf("apt-get download %s: %v\n%s", pkg, err, b)
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		return "", fmt.Errorf("apt-get download %s left %d packages", pkg, len(debs))
	}
	x := filepath.Join(tmp, "x")
	if b, err := exec.CommandContext(ctx, "dpkg-deb", "-x", debs[0], x).CombinedOutput(); err != nil {
		return "", fmt.Errorf("dpkg-deb -x: %v\n%s", err, b)
	}
	images, _ := filepath.Glob(filepath.Join(x, "boot", "vmlinuz-*"))
	if len(images) != 1 {
		return "", fmt.Errorf("%s holds %d kernel images", pkg, len(images))
	}
	dst := filepath.Join(cache, KernelDir)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return "", err
	}
	b, err := os.ReadFile(images[0])
	if err != nil {
		return "", err
	}
	// Write beside, then rename: a half-written image is never found.
	final := filepath.Join(dst, filepath.Base(images[0]))
	if err := os.WriteFile(final+".tmp", b, 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(final+".tmp", final); err != nil {
		return "", err
	}
	return final, nil
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
	// MemoryMiB and CPUs size the VM (defaults: 3072 MiB, 2).
	MemoryMiB, CPUs int
	// Output receives everything the guest prints on its console.
	Output io.Writer
}

// Run builds the initramfs, boots the guest and returns the command's exit
// code. It fails when the guest ends without printing one (a kernel panic,
// a timeout from ctx).
func Run(ctx context.Context, s Spec) (int, error) {
	if _, err := exec.LookPath(Qemu); err != nil {
		return 0, fmt.Errorf("%s not found (apt-get install qemu-system-x86): %w", Qemu, err)
	}
	dir, err := os.MkdirTemp("", "guestvm-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	initrd := filepath.Join(dir, "initrd.gz")
	if err := s.writeInitramfs(initrd); err != nil {
		return 0, fmt.Errorf("initramfs: %w", err)
	}
	mem, cpus := s.MemoryMiB, s.CPUs
	if mem == 0 {
		mem = 3072
	}
	if cpus == 0 {
		cpus = 2
	}
	cmd := exec.CommandContext(ctx, Qemu,
		"-machine", "q35", "-cpu", "max", "-accel", "tcg,thread=multi",
		"-smp", strconv.Itoa(cpus), "-m", strconv.Itoa(mem),
		"-nographic", "-no-reboot", "-nic", "none",
		"-kernel", s.Kernel, "-initrd", initrd,
		"-append", "console=ttyS0 cgroup_no_v1=all psi=1 panic=-1 quiet loglevel=3 rdinit=/init")
	cmd.WaitDelay = 5 * time.Second
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	code := -1
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := strings.TrimRight(sc.Text(), "\r")
			if s.Output != nil {
				fmt.Fprintln(s.Output, line)
			}
			if rest, ok := strings.CutPrefix(line, ExitMarker); ok {
				if n, err := strconv.Atoi(strings.TrimSpace(rest)); err == nil {
					code = n
				}
			}
		}
		io.Copy(io.Discard, pr)
	}()
	werr := cmd.Wait()
	pw.Close()
	<-scanned
	if code < 0 {
		if ctx.Err() != nil {
			return 0, fmt.Errorf("guest did not finish: %w", ctx.Err())
		}
		return 0, fmt.Errorf("guest ended without an exit code (qemu: %v)", werr)
	}
	return code, nil
}

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
	gz := gzip.NewWriter(f)
	w := cpio.NewWriter(gz)
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
	if err := gz.Close(); err != nil {
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
