// Command labkeep-binaries builds (once) and caches the Kubernetes binaries
// that localrun starts (etcd, kube-apiserver, kube-controller-manager, and
// the node's kubelet and kube-scheduler), and prints their directory. `make test` and `make run` call it first
// so the minutes-long cold build shows progress instead of a silent test.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/kelseyhightower/envconfig"

	"labkeep/localrun/controlplane"
)

type config struct {
	BinCache string `envconfig:"BIN_CACHE"`
}

func main() {
	var cfg config
	if err := envconfig.Process("labkeep", &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "labkeep-binaries:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := controlplane.DefaultCacheDir(cfg.BinCache)
	if err == nil {
		var b controlplane.Binaries
		b, err = controlplane.EnsureBinaries(ctx, dir, controlplane.DefaultVersions, os.Stderr)
		if err == nil {
			fmt.Println(filepath.Dir(b.APIServer))
			return
		}
	}
	fmt.Fprintln(os.Stderr, "labkeep-binaries:", err)
	os.Exit(1)
}
