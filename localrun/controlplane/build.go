package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Versions pins what the local control plane is built from. KubernetesVersion
// tracks the minor of the k8s.io client libraries in go.mod (0.33 → 1.33), and
// EtcdVersion is the etcd that Kubernetes release itself is tested with.
// KubeVirt and CDIAPI are the kubevirt.io/api and
// kubevirt.io/containerized-data-importer-api versions in go.mod: the
// KubeVirt CRDs are generated from that KubeVirt release (kubevirtcrds.go).
type Versions struct {
	Kubernetes string // e.g. "v1.33.13"
	Etcd       string // e.g. "v3.5.21"
	KubeVirt   string // e.g. "v1.7.0"
	CDIAPI     string // e.g. "v1.63.1"
	// CoreDNS is the cluster DNS's release, built against Kubernetes'
	// own client libraries (see buildCoreDNS).
	CoreDNS string // e.g. "v1.12.3"
}

// ClientLibraries is the release of Kubernetes' Go libraries (k8s.io/api,
// apimachinery, client-go, ...) that matches v.Kubernetes: v0.<minor>.<patch>.
// Programs built beside the control plane pin them to it, so their packages
// come from the same build cache.
func (v Versions) ClientLibraries() string { return "v0" + strings.TrimPrefix(v.Kubernetes, "v1") }

// DefaultVersions are the versions labkeep tests against.
var DefaultVersions = Versions{Kubernetes: "v1.33.13", Etcd: "v3.5.21", KubeVirt: "v1.7.0", CDIAPI: "v1.63.1", CoreDNS: "v1.12.3"}

// stagingModules are the k8s.io modules that k8s.io/kubernetes requires at
// v0.0.0 and replaces with its own staging directory; outside that repository
// each must be replaced with the published v0.<minor>.<patch> release.
var stagingModules = []string{
	"api", "apiextensions-apiserver", "apimachinery", "apiserver", "cli-runtime",
	"client-go", "cloud-provider", "cluster-bootstrap", "code-generator",
	"component-base", "component-helpers", "controller-manager", "cri-api",
	"cri-client", "csi-translation-lib", "dynamic-resource-allocation",
	"endpointslice", "externaljwt", "kms", "kube-aggregator",
	"kube-controller-manager", "kube-proxy", "kube-scheduler", "kubectl",
	"kubelet", "metrics", "mount-utils", "pod-security-admission",
	"sample-apiserver",
}

// Binaries are the paths of the programs the local stack runs: the three
// of the control plane, the node's kubelet, kube-scheduler and kube-proxy,
// and the cluster DNS (which runs in a Pod: package images wraps it).
type Binaries struct {
	Etcd, APIServer, ControllerManager string
	Kubelet, Scheduler, Proxy          string
	CoreDNS                            string
}

// kubeCommands are the k8s.io/kubernetes commands EnsureBinaries builds,
// with the Binaries field each one fills.
var kubeCommands = []struct {
	pkg string
	out func(*Binaries) *string
}{
	{"k8s.io/kubernetes/cmd/kube-apiserver", func(b *Binaries) *string { return &b.APIServer }},
	{"k8s.io/kubernetes/cmd/kube-controller-manager", func(b *Binaries) *string { return &b.ControllerManager }},
	{"k8s.io/kubernetes/cmd/kubelet", func(b *Binaries) *string { return &b.Kubelet }},
	{"k8s.io/kubernetes/cmd/kube-scheduler", func(b *Binaries) *string { return &b.Scheduler }},
	{"k8s.io/kubernetes/cmd/kube-proxy", func(b *Binaries) *string { return &b.Proxy }},
}

// DefaultCacheDir is where built binaries are kept between runs:
// $LABKEEP_BIN_CACHE when the caller passes it, else <user cache>/labkeep/bin.
func DefaultCacheDir(override string) (string, error) {
	if override != "" {
		return override, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no user cache dir (set LABKEEP_BIN_CACHE): %w", err)
	}
	return filepath.Join(base, "labkeep", "bin"), nil
}

// EnsureBinaries returns the local stack's binaries for v under cacheDir,
// building only those that are missing from the Go module proxy first (a
// cache holding the control plane but no kubelet builds just the kubelet and
// kube-scheduler). A cold build takes minutes, so progress goes to progress.
// Binaries are written to a temp name and renamed, so an interrupted build
// never leaves a half-written file that a later run would trust.
func EnsureBinaries(ctx context.Context, cacheDir string, v Versions, progress io.Writer) (Binaries, error) {
	dir := filepath.Join(cacheDir, "k8s-"+v.Kubernetes+"_etcd-"+v.Etcd)
	b := Binaries{
		Etcd:              filepath.Join(dir, "etcd"),
		APIServer:         filepath.Join(dir, "kube-apiserver"),
		ControllerManager: filepath.Join(dir, "kube-controller-manager"),
		Kubelet:           filepath.Join(dir, "kubelet"),
		Scheduler:         filepath.Join(dir, "kube-scheduler"),
		Proxy:             filepath.Join(dir, "kube-proxy"),
		CoreDNS:           filepath.Join(dir, "coredns-"+v.CoreDNS),
	}
	if exists(b.Etcd) && len(b.missingKube()) == 0 && exists(b.CoreDNS) {
		return b, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Binaries{}, err
	}
	lock, err := LockFile(filepath.Join(dir, ".lock"))
	if err != nil {
		return Binaries{}, err
	}
	defer lock.Close()

	if !exists(b.Etcd) {
		if err := buildEtcd(ctx, dir, v.Etcd, b.Etcd, progress); err != nil {
			return Binaries{}, fmt.Errorf("build etcd %s: %w", v.Etcd, err)
		}
	}
	if missing := b.missingKube(); len(missing) > 0 {
		if err := buildKubernetes(ctx, dir, v.Kubernetes, missing, progress); err != nil {
			return Binaries{}, fmt.Errorf("build kubernetes %s: %w", v.Kubernetes, err)
		}
	}
	if !exists(b.CoreDNS) {
		if err := buildCoreDNS(ctx, dir, v, b.CoreDNS, progress); err != nil {
			return Binaries{}, fmt.Errorf("build coredns %s: %w", v.CoreDNS, err)
		}
	}
	return b, nil
}

// corednsPlugins are the CoreDNS plugins the cluster DNS is built with, in
// the order CoreDNS runs them (its plugin.cfg's): a cluster's DNS and its
// health and readiness endpoints. There is no forward plugin: nothing
// outside the machine can be reached, so names outside the cluster's zones
// get no answer.
var corednsPlugins = []string{"reload", "ready", "health", "errors", "cache", "kubernetes"}

// buildCoreDNS builds CoreDNS with corednsPlugins only, in a wrapper
// module that pins Kubernetes' client libraries to the control plane's
// release, so their packages come from the same build cache as the
// control plane's.
func buildCoreDNS(ctx context.Context, dir string, v Versions, out string, progress io.Writer) error {
	gomod := fmt.Sprintf("module labkeep.local/corednsbuild\n\ngo 1.24\n\nrequire (\n\tgithub.com/coredns/coredns %s\n\tk8s.io/api %[2]s\n\tk8s.io/apimachinery %[2]s\n\tk8s.io/client-go %[2]s\n)\n",
		v.CoreDNS, v.ClientLibraries())
	var main strings.Builder
	main.WriteString("package main\n\nimport (\n\t\"github.com/coredns/coredns/core/dnsserver\"\n\t\"github.com/coredns/coredns/coremain\"\n\n")
	for _, p := range corednsPlugins {
		fmt.Fprintf(&main, "\t_ \"github.com/coredns/coredns/plugin/%s\"\n", p)
	}
	fmt.Fprintf(&main, ")\n\nfunc main() {\n\tdnsserver.Directives = %#v\n\tcoremain.Run()\n}\n", corednsPlugins)
	start := time.Now()
	fmt.Fprintf(progress, "labkeep: building coredns %s (once; cached in %s)\n", v.CoreDNS, dir)
	if err := BuildWrapper(ctx, dir, map[string]string{"go.mod": gomod, "main.go": main.String()}, out, progress); err != nil {
		return err
	}
	fmt.Fprintf(progress, "labkeep: built coredns in %s\n", time.Since(start).Round(time.Second))
	return nil
}

// kubeBuild is one k8s.io/kubernetes command to build into out.
type kubeBuild struct{ pkg, out string }

// missingKube returns the Kubernetes commands of b not built yet, in
// kubeCommands order.
func (b Binaries) missingKube() []kubeBuild {
	var m []kubeBuild
	for _, c := range kubeCommands {
		if out := *c.out(&b); !exists(out) {
			m = append(m, kubeBuild{c.pkg, out})
		}
	}
	return m
}

func exists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

func buildEtcd(ctx context.Context, dir, version, out string, progress io.Writer) error {
	gomod := fmt.Sprintf("module labkeep.local/etcdbuild\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 %s\n", version)
	main := "package main\n\nimport (\n\t\"os\"\n\n\t\"go.etcd.io/etcd/server/v3/etcdmain\"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n"
	fmt.Fprintf(progress, "labkeep: building etcd %s (once; cached in %s)\n", version, dir)
	return BuildWrapper(ctx, dir, map[string]string{"go.mod": gomod, "main.go": main}, out, progress)
}

// BuildWrapper builds a program from a wrapper module of its own (files:
// go.mod and the main package, by name) in a temp dir under dir: `go mod
// tidy`, then a static, stripped build to out (through a temp name, so an
// interrupted build never leaves a file a later run would trust).
func BuildWrapper(ctx context.Context, dir string, files map[string]string, out string, progress io.Writer) error {
	mod, err := os.MkdirTemp(dir, filepath.Base(out)+"-build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(mod)
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(mod, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	if err := goCmd(ctx, mod, progress, "mod", "tidy"); err != nil {
		return err
	}
	return buildTo(ctx, mod, ".", out, progress)
}

func buildKubernetes(ctx context.Context, dir, version string, builds []kubeBuild, progress io.Writer) error {
	mod, err := os.MkdirTemp(dir, "k8s-build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(mod)
	staging := Versions{Kubernetes: version}.ClientLibraries()
	var sb strings.Builder
	fmt.Fprintf(&sb, "module labkeep.local/k8sbuild\n\ngo 1.24\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n", version)
	for _, m := range stagingModules {
		fmt.Fprintf(&sb, "\tk8s.io/%s => k8s.io/%s %s\n", m, m, staging)
	}
	sb.WriteString(")\n")
	var tools strings.Builder
	tools.WriteString("//go:build tools\n\npackage tools\n\nimport (\n")
	var names []string
	for _, bd := range builds {
		fmt.Fprintf(&tools, "\t_ %q\n", bd.pkg)
		names = append(names, filepath.Base(bd.out))
	}
	tools.WriteString(")\n")
	if err := os.WriteFile(filepath.Join(mod, "go.mod"), []byte(sb.String()), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(mod, "tools.go"), []byte(tools.String()), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(progress, "labkeep: building %s %s (once, 1-4 minutes each on 2 cores; cached in %s)\n", strings.Join(names, ", "), version, dir)
	if err := goCmd(ctx, mod, progress, "mod", "tidy", "-e"); err != nil {
		return err
	}
	for _, bd := range builds {
		start := time.Now()
		fmt.Fprintf(progress, "labkeep: go build %s ...\n", bd.pkg)
		if err := buildTo(ctx, mod, bd.pkg, bd.out, progress); err != nil {
			return err
		}
		fmt.Fprintf(progress, "labkeep: built %s in %s\n", filepath.Base(bd.out), time.Since(start).Round(time.Second))
	}
	return nil
}

func buildTo(ctx context.Context, mod, pkg, out string, progress io.Writer) error {
	return BuildTo(ctx, mod, pkg, out, nil, progress)
}

// BuildTo builds the package pkg of the module in mod to out as the
// control plane's binaries are built: -trimpath, stripped, GOWORK off and
// cgo off unless env sets CGO_ENABLED=1 (env is added to the environment;
// a later value of a variable wins). It writes a temp name and renames it,
// so an interrupted build never leaves a file a later run would trust.
func BuildTo(ctx context.Context, mod, pkg, out string, env []string, progress io.Writer) error {
	tmp := out + ".partial"
	_ = os.Remove(tmp)
	if err := goCmdEnv(ctx, mod, env, progress, "build", "-trimpath", "-ldflags=-s -w", "-o", tmp, pkg); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, out)
}

// lockedWriter serialises writes from go build's output copier and
// buildTo's ticker.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// progressEvery is how often a running go command says it is still
// running: a cold go mod tidy or go build prints nothing for minutes.
const progressEvery = 15 * time.Second

// goCmd runs the go command in dir with its output to progress, saying
// what it runs and for how long every progressEvery.
func goCmd(ctx context.Context, dir string, progress io.Writer, args ...string) error {
	return goCmdEnv(ctx, dir, nil, progress, args...)
}

// goCmdEnv is goCmd with env added to the command's environment (a later
// value of a variable wins).
func goCmdEnv(ctx context.Context, dir string, env []string, progress io.Writer, args ...string) error {
	cmd, err := goCommand(ctx, dir, args...)
	if err != nil {
		return err
	}
	cmd.Env = append(cmd.Env, env...)
	if progress == nil {
		progress = io.Discard
	}
	progress = &lockedWriter{w: progress} // the command's output and the ticker share it
	cmd.Stdout = progress
	cmd.Stderr = progress
	what := "go " + strings.Join(args[:min(2, len(args))], " ")
	if args[0] == "build" {
		what = "go build " + args[len(args)-1]
	}
	done := make(chan struct{})
	defer close(done)
	go func(start time.Time) {
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fmt.Fprintf(progress, "labkeep: still running %s (%s elapsed)\n", what, time.Since(start).Round(time.Second))
			}
		}
	}(time.Now())
	return cmd.Run()
}

// goCommand is the go command run in the wrapper module dir, outside any
// workspace, free to update go.mod, and without cgo.
func goCommand(ctx context.Context, dir string, args ...string) (*exec.Cmd, error) {
	gobin := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	if !exists(gobin) {
		var err error
		if gobin, err = exec.LookPath("go"); err != nil {
			return nil, errors.New("the go command is needed to build the control plane")
		}
	}
	cmd := exec.CommandContext(ctx, gobin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "CGO_ENABLED=0")
	return cmd, nil
}
