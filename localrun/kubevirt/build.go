package kubevirt

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"labkeep/localrun/controlplane"
)

// Binaries are the programs and files of KubeVirt that the local node's
// images hold, built from kubevirt.io/kubevirt at the control plane's
// Versions.KubeVirt, plus labkeep's install program.
type Binaries struct {
	// Version is KubeVirt's release; Dir the cache directory holding
	// them all.
	Version, Dir string
	// KubeVirt's commands. Launcher, LauncherMonitor, Handler and Chroot
	// are linked with cgo against the C library of the machine that built
	// them (Debian 12 here, as the node image is); libvirt is opened at run
	// time (the libvirt_dlopen build tag), so no libvirt headers are
	// needed to build. ContainerDisk is KubeVirt's static C helper that
	// a containerDisk's container runs.
	API, Controller, Handler, Chroot         string
	Launcher, LauncherMonitor, ContainerDisk string
	Freezer, Probe, Tail                     string
	// Install is labkeep's program that prints the objects of an
	// installation (see install.go.txt).
	Install string
	// Files from KubeVirt's source that its images carry: the node
	// labeller script, virt-launcher's qemu.conf and virtqemud.conf, and
	// its nsswitch.conf.
	NodeLabeller, QEMUConf, VirtqemudConf, NSSwitch string
}

// installMain is the install program's main package.
//
//go:embed install.go.txt
var installMain string

// component is one program EnsureBinaries builds: a KubeVirt package (or
// "." for the install program) and whether it needs cgo.
type component struct {
	pkg string
	cgo bool
	out func(*Binaries) *string
}

var components = []component{
	{"kubevirt.io/kubevirt/cmd/virt-api", false, func(b *Binaries) *string { return &b.API }},
	{"kubevirt.io/kubevirt/cmd/virt-controller", false, func(b *Binaries) *string { return &b.Controller }},
	{"kubevirt.io/kubevirt/cmd/virt-freezer", false, func(b *Binaries) *string { return &b.Freezer }},
	{"kubevirt.io/kubevirt/cmd/virt-probe", false, func(b *Binaries) *string { return &b.Probe }},
	{"kubevirt.io/kubevirt/cmd/virt-tail", false, func(b *Binaries) *string { return &b.Tail }},
	{"kubevirt.io/kubevirt/cmd/virt-handler", true, func(b *Binaries) *string { return &b.Handler }},
	{"kubevirt.io/kubevirt/cmd/virt-chroot", true, func(b *Binaries) *string { return &b.Chroot }},
	{"kubevirt.io/kubevirt/cmd/virt-launcher", true, func(b *Binaries) *string { return &b.Launcher }},
	{"kubevirt.io/kubevirt/cmd/virt-launcher-monitor", true, func(b *Binaries) *string { return &b.LauncherMonitor }},
	{".", false, func(b *Binaries) *string { return &b.Install }},
}

// sourceFiles are the files EnsureBinaries copies from KubeVirt's source.
var sourceFiles = []struct {
	src string
	out func(*Binaries) *string
}{
	{"cmd/virt-launcher/node-labeller/node-labeller.sh", func(b *Binaries) *string { return &b.NodeLabeller }},
	{"cmd/virt-launcher/qemu.conf", func(b *Binaries) *string { return &b.QEMUConf }},
	{"cmd/virt-launcher/virtqemud.conf", func(b *Binaries) *string { return &b.VirtqemudConf }},
	{"cmd/virt-launcher/nsswitch.conf", func(b *Binaries) *string { return &b.NSSwitch }},
}

// binariesFor names every file of v's build under dir.
func binariesFor(version, dir string) Binaries {
	b := Binaries{Version: version, Dir: dir, ContainerDisk: filepath.Join(dir, "container-disk")}
	for _, c := range components {
		name := filepath.Base(c.pkg)
		if c.pkg == "." { // named after its source, so a change rebuilds it
			sum := sha256.Sum256([]byte(installMain))
			name = "labkeep-kubevirt-install-" + hex.EncodeToString(sum[:])[:12]
		}
		*c.out(&b) = filepath.Join(dir, name)
	}
	for _, f := range sourceFiles {
		*f.out(&b) = filepath.Join(dir, filepath.Base(f.src))
	}
	return b
}

// all lists every path of b.
func (b Binaries) all() []string {
	out := []string{b.ContainerDisk}
	for _, c := range components {
		out = append(out, *c.out(&b))
	}
	for _, f := range sourceFiles {
		out = append(out, *f.out(&b))
	}
	return out
}

// EnsureBinaries returns KubeVirt's binaries for v under cacheDir, building
// them first if any is missing: once, a few minutes on a warm Go cache
// (KubeVirt's dependency tree is large), progress to progress.
func EnsureBinaries(ctx context.Context, cacheDir string, v controlplane.Versions, progress io.Writer) (Binaries, error) {
	if progress == nil {
		progress = io.Discard
	}
	dir := filepath.Join(cacheDir, "kubevirt-"+v.KubeVirt+"_components")
	b := binariesFor(v.KubeVirt, dir)
	if complete(b) {
		return b, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Binaries{}, err
	}
	lock, err := controlplane.LockFile(filepath.Join(dir, ".lock"))
	if err != nil {
		return Binaries{}, err
	}
	defer lock.Close()
	if complete(b) { // built by another process while this one waited
		return b, nil
	}
	start := time.Now()
	fmt.Fprintf(progress, "labkeep: building KubeVirt %s (once, several minutes; cached in %s)\n", v.KubeVirt, dir)
	if err := build(ctx, b, v, progress); err != nil {
		return Binaries{}, fmt.Errorf("build KubeVirt %s: %w", v.KubeVirt, err)
	}
	fmt.Fprintf(progress, "labkeep: built KubeVirt %s in %s\n", v.KubeVirt, time.Since(start).Round(time.Second))
	return b, nil
}

func complete(b Binaries) bool {
	for _, p := range b.all() {
		if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() {
			return false
		}
	}
	return true
}

func build(ctx context.Context, b Binaries, v controlplane.Versions, progress io.Writer) error {
	mod, source, err := controlplane.KubeVirtModule(ctx, b.Dir, v, map[string]string{"main.go": installMain}, progress)
	if err != nil {
		return err
	}
	defer os.RemoveAll(mod)
	for _, c := range components {
		out := *c.out(&b)
		if regular(out) {
			continue
		}
		var env []string
		if c.cgo {
			env = []string{"CGO_ENABLED=1", "GOFLAGS=-mod=mod -tags=libvirt_dlopen"}
		}
		if err := controlplane.BuildTo(ctx, mod, c.pkg, out, env, progress); err != nil {
			return err
		}
	}
	for _, f := range sourceFiles {
		if err := copyFile(filepath.Join(source, f.src), *f.out(&b)); err != nil {
			return err
		}
	}
	if !regular(b.ContainerDisk) {
		tmp := b.ContainerDisk + ".partial"
		cc := exec.CommandContext(ctx, "gcc", "-static", "-O2", "-o", tmp, filepath.Join(source, "cmd/container-disk-v2alpha/main.c"))
		if out, err := cc.CombinedOutput(); err != nil {
			return fmt.Errorf("gcc container-disk: %w: %s", err, out)
		}
		if err := os.Rename(tmp, b.ContainerDisk); err != nil {
			return err
		}
	}
	return nil
}

func regular(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// copyFile copies src to dst (temp name, then renamed), keeping the
// executable bit of src.
func copyFile(src, dst string) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return errors.New(src + " is not a regular file")
	}
	body, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	tmp := dst + ".partial"
	if err := os.WriteFile(tmp, body, st.Mode().Perm()|0o644); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}
