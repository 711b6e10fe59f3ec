// Command labkeep-binaries builds (once) and caches the Kubernetes binaries
// that localrun starts (etcd, kube-apiserver, kube-controller-manager, and
// the node's kubelet and kube-scheduler), generates KubeVirt's CRDs
// (controlplane.EnsureKubeVirtCRDs), builds KubeVirt's programs
// (kubevirt.EnsureBinaries) and, when run as root (the node needs root,
// and so does debootstrap), the node's images, KubeVirt's and the VM
// labs' guest disk among them; it prints the
// binaries' directory. It also unpacks the kernel the cgroup v2 test VMs
// boot, and the modules the guest node loads (localrun/guestvm,
// localrun/guestnode), unless -for run (`make run` boots no test VM).
// `make test` and `make run` call it first so the minutes-long cold build
// shows progress instead of a silent test.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/kelseyhightower/envconfig"

	"labkeep/localrun/controlplane"
	"labkeep/localrun/guestnode"
	"labkeep/localrun/images"
	"labkeep/localrun/kubevirt"
	"labkeep/localrun/netpolicy"
)

type config struct {
	BinCache string `envconfig:"BIN_CACHE"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "labkeep-binaries:", err)
		os.Exit(1)
	}
}

func run() error {
	mode := flag.String("for", "test", "what the binaries are for: run (make run) or test (adds the test VM's kernel)")
	flag.Parse()
	if *mode != "run" && *mode != "test" {
		return fmt.Errorf("-for must be run or test, got %q", *mode)
	}
	var cfg config
	if err := envconfig.Process("labkeep", &cfg); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := controlplane.DefaultCacheDir(cfg.BinCache)
	if err != nil {
		return err
	}
	b, err := controlplane.EnsureBinaries(ctx, dir, controlplane.DefaultVersions, os.Stderr)
	if err != nil {
		return err
	}
	if _, err := controlplane.EnsureKubeVirtCRDs(ctx, dir, controlplane.DefaultVersions, os.Stderr); err != nil {
		return err
	}
	if _, err := netpolicy.EnsureEngine(ctx, dir, controlplane.DefaultVersions, os.Stderr); err != nil {
		return err
	}
	virt, err := kubevirt.EnsureBinaries(ctx, dir, controlplane.DefaultVersions, os.Stderr)
	if err != nil {
		return err
	}
	if *mode == "test" {
		if _, _, err := guestnode.EnsureKernel(ctx, dir, os.Stderr); err != nil {
			return err
		}
	}
	if os.Geteuid() == 0 {
		if _, err := images.Build(ctx, images.Options{CacheDir: filepath.Join(dir, "images"), Progress: os.Stderr, CoreDNS: b.CoreDNS, KubeVirt: &virt}); err != nil {
			return err
		}
	}
	fmt.Println(filepath.Dir(b.APIServer))
	return nil
}
