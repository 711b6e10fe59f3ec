// Package images builds, without a registry and without Docker, every
// container image the local node runs, under the names a production cluster
// pulls them by, so Pods specs need no local variant: the node imports them
// into its containerd before the first Pod is scheduled.
//
// The image formats (config, manifest, docker-archive tarball) come from
// go-containerregistry, the library ko uses; a layer's tar stream comes from
// GNU tar with the flags of reproducible-builds.org (sorted names, fixed
// mtime, numeric root owner), so the same inputs give the same digests.
package images

import (
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"labkeep/localrun/controlplane"
	"labkeep/localrun/kubevirt"
)

// The images the local node provides. Each is what a production cluster
// pulls under that name; the local copies are stand-ins where production
// uses someone else's image (pause, virt-launcher) and the real thing where
// production uses labkeep's own (guardian, workspace).
const (
	// Pause is the sandbox image (containerd's sandbox_image and kubelet's
	// default for 1.33) and the anchor Job's container: a static program of
	// labkeep's that reaps orphans as PID 1 and exits on SIGTERM/SIGINT.
	Pause = "registry.k8s.io/pause:3.10"
	// VirtLauncher is what virtsim's virt-launcher Pods run: a static
	// program of labkeep's that sleeps like pause and answers on a few TCP
	// ports as a guest would, and can probe addresses from inside the Pod
	// (localrun/images/launcher), so a "VM" costs next to nothing and its
	// network confinement can still be tried by traffic.
	VirtLauncher = "virtsim.labkeep.io/virt-launcher:latest"
	// Guardian is the workspace Pod's sidecar, built as infra/guardian/.ko.yaml
	// describes (static, CGO_ENABLED=0, -trimpath, -s -w, at /ko-app/guardian).
	Guardian = "ghcr.io/labkeep/guardian:latest"
	// Workspace is the student's container of a Pod lab: Debian 12 with
	// OpenSSH and bash, sshd as its main process (see workspaceInit).
	Workspace = "ghcr.io/labkeep/workspace:debian12"
)

// CoreDNS is the cluster DNS, under the name production clusters pull it
// by: CoreDNS's own release, built with a cluster DNS's plugins only
// (controlplane.EnsureBinaries).
var CoreDNS = "registry.k8s.io/coredns/coredns:" + controlplane.DefaultVersions.CoreDNS

// All lists every image name Build provides.
var All = []string{Pause, VirtLauncher, Guardian, Workspace, CoreDNS}

// Options configures Build.
type Options struct {
	// CacheDir keeps built archives between runs (the binary cache dir's
	// "images" subdirectory is the convention).
	CacheDir string
	// Progress receives one line per image built (nil = discard).
	Progress io.Writer
	// NoWorkspace skips the Debian workspace image (minutes on a cold
	// cache; tests of the node alone do not need it).
	NoWorkspace bool
	// CoreDNS is the built CoreDNS binary the CoreDNS image holds
	// (required).
	CoreDNS string
	// KubeVirt, when set, adds KubeVirt's images built from these
	// binaries (see kubeVirtImages) and the VM labs' guest disk
	// (GuestDisk): minutes on a cold cache.
	KubeVirt *kubevirt.Binaries
}

// Archive is one docker-archive tarball (what `docker save` writes and
// `ctr images import` reads) holding one image under one or more names.
type Archive struct {
	Path  string
	Names []string
}

// Build builds (or takes from the cache) every image and returns their
// archives. The small images are rebuilt each time from Go's build cache (a
// second or two) so they never go stale; the workspace image is rebuilt
// only when its recipe changes.
func Build(ctx context.Context, opts Options) ([]Archive, error) {
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	if err := os.MkdirAll(opts.CacheDir, 0o755); err != nil {
		return nil, err
	}
	lock, err := controlplane.LockFile(filepath.Join(opts.CacheDir, ".lock"))
	if err != nil {
		return nil, err
	}
	defer lock.Close()

	work, err := os.MkdirTemp(opts.CacheDir, "build-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	var out []Archive
	for _, b := range []struct {
		pkg, file string // Go package, path in the image
		names     []string
	}{
		{"labkeep/localrun/images/pause", "/pause", []string{Pause}},
		{"labkeep/localrun/images/launcher", "/launcher", []string{VirtLauncher}},
		{"labkeep/guardian/cmd/guardian", "/ko-app/guardian", []string{Guardian}},
	} {
		start := time.Now()
		a, err := goImage(ctx, work, opts.CacheDir, b.pkg, b.file, b.names)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", b.names[0], err)
		}
		fmt.Fprintf(progress, "labkeep: image %s ready in %s\n", b.names[0], time.Since(start).Round(10*time.Millisecond))
		out = append(out, a)
	}
	start := time.Now()
	a, err := binaryImage(ctx, work, opts.CacheDir, opts.CoreDNS, "/coredns", []string{CoreDNS})
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", CoreDNS, err)
	}
	fmt.Fprintf(progress, "labkeep: image %s ready in %s\n", CoreDNS, time.Since(start).Round(10*time.Millisecond))
	out = append(out, a)
	if !opts.NoWorkspace {
		start := time.Now()
		a, err := workspaceImage(ctx, work, opts.CacheDir, progress)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", Workspace, err)
		}
		fmt.Fprintf(progress, "labkeep: image %s ready in %s\n", Workspace, time.Since(start).Round(10*time.Millisecond))
		out = append(out, a)
	}
	if opts.KubeVirt != nil {
		start := time.Now()
		a, err := kubeVirtImages(ctx, work, opts.CacheDir, *opts.KubeVirt, progress)
		if err != nil {
			return nil, fmt.Errorf("KubeVirt images: %w", err)
		}
		fmt.Fprintf(progress, "labkeep: KubeVirt's images ready in %s\n", time.Since(start).Round(10*time.Millisecond))
		out = append(out, a)
		start = time.Now()
		if a, err = GuestDisk(ctx, work, opts.CacheDir, progress); err != nil {
			return nil, fmt.Errorf("image %s: %w", GuestDebian, err)
		}
		fmt.Fprintf(progress, "labkeep: image %s ready in %s\n", GuestDebian, time.Since(start).Round(10*time.Millisecond))
		out = append(out, a)
	}
	return out, nil
}

// goImage builds pkg as a static binary and wraps it, alone, as an image
// whose entrypoint it is. The archive is named after the binary's hash, so
// an unchanged binary reuses its archive.
func goImage(ctx context.Context, work, cache, pkg, file string, names []string) (Archive, error) {
	root := filepath.Join(work, filepath.Base(pkg)+"-root")
	bin := filepath.Join(root, file)
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return Archive{}, err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if out, err := cmd.CombinedOutput(); err != nil {
		return Archive{}, fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
	}
	return rootImage(ctx, work, cache, root, filepath.Base(pkg), file, names)
}

// binaryImage wraps the static binary src, alone, at file as an image
// whose entrypoint it is (see rootImage).
func binaryImage(ctx context.Context, work, cache, src, file string, names []string) (Archive, error) {
	if src == "" {
		return Archive{}, errors.New("no binary given")
	}
	prefix := filepath.Base(file)
	root := filepath.Join(work, prefix+"-root")
	bin := filepath.Join(root, file)
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return Archive{}, err
	}
	if err := os.Link(src, bin); err != nil { // a copy where src is on another file system
		if err := copyFile(src, bin); err != nil {
			return Archive{}, err
		}
	}
	return rootImage(ctx, work, cache, root, prefix, file, names)
}

// copyFile copies src to dst, executable.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// rootImage writes root, whose only file is the binary file, as an image
// whose entrypoint it is. The archive is named prefix-<the binary's
// hash>, so an unchanged binary reuses its archive.
func rootImage(ctx context.Context, work, cache, root, prefix, file string, names []string) (Archive, error) {
	sum, err := fileHash(filepath.Join(root, file))
	if err != nil {
		return Archive{}, err
	}
	path := filepath.Join(cache, fmt.Sprintf("%s-%s.tar", prefix, sum[:16]))
	if exists(path) {
		return Archive{Path: path, Names: names}, nil
	}
	pruneArchives(cache, prefix)
	cfg := v1.Config{Entrypoint: []string{file}, WorkingDir: "/", Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}}
	if err := writeImage(ctx, work, root, path, cfg, names); err != nil {
		return Archive{}, err
	}
	return Archive{Path: path, Names: names}, nil
}

// epoch is the creation time and every file's mtime in built images: fixed,
// so that rebuilding from the same inputs yields the same digests.
var epoch = time.Unix(0, 0).UTC()

// writeImage makes a one-layer image of dir with config cfg and writes it
// under names to the docker archive path (atomically: temp file + rename).
func writeImage(ctx context.Context, work, dir, path string, cfg v1.Config, names []string) error {
	layerTar, err := os.CreateTemp(work, "layer-*.tar")
	if err != nil {
		return err
	}
	layerTar.Close()
	tar := exec.CommandContext(ctx, "tar", "--create", "--file", layerTar.Name(),
		"--directory", dir, "--sort=name", "--mtime=@0", "--clamp-mtime",
		"--owner=0", "--group=0", "--numeric-owner", "--xattrs", "--format=posix",
		"--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
		".")
	if out, err := tar.CombinedOutput(); err != nil {
		return fmt.Errorf("tar %s: %w\n%s", dir, err, out)
	}
	layer, err := tarball.LayerFromFile(layerTar.Name(), tarball.WithCompressionLevel(gzip.BestSpeed), tarball.WithCompressedCaching)
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.Config = cfg
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: epoch}
	cf.History = nil
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	refs := map[name.Reference]v1.Image{}
	for _, n := range names {
		tag, err := name.NewTag(n)
		if err != nil {
			return err
		}
		refs[tag] = img
	}
	tmp := path + ".partial"
	if err := tarball.MultiRefWriteToFile(tmp, refs); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// pruneArchives removes the archives of earlier builds named
// <prefix>-<hash>.tar that are over an hour old, so the cache does not grow
// with every change of the sources, while a node that started a moment ago
// (another test binary) can still import the archive its Build returned.
func pruneArchives(cache, prefix string) {
	old, _ := filepath.Glob(filepath.Join(cache, prefix+"-*.tar"))
	for _, o := range old {
		if st, err := os.Stat(o); err == nil && time.Since(st.ModTime()) > time.Hour {
			os.Remove(o)
		}
	}
}

func fileHash(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func exists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// Names reports the image names an archive holds, for checks against what
// a node has imported.
func Names(archives []Archive) []string {
	var names []string
	for _, a := range archives {
		names = append(names, a.Names...)
	}
	return names
}

// ErrNoDebootstrap is returned when the workspace image must be built and
// debootstrap is not installed (localrun/setup.sh installs it).
var ErrNoDebootstrap = errors.New("debootstrap not found (run localrun/setup.sh)")
