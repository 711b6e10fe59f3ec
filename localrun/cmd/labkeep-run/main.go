// Command labkeep-run is `make run`: it starts the local stack (a real
// Kubernetes control plane, a real node with real KubeVirt on it — or, with
// LABKEEP_VMS=virtsim, the virtsim stand-in, in which no VM boots — and a
// throwaway PostgreSQL), writes a kubeconfig and the settings into a state
// directory, and keeps everything up until Ctrl-C, which stops it all.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kelseyhightower/envconfig"

	"labkeep/localrun/controlplane"
	"labkeep/localrun/devserve"
	"labkeep/localrun/node"
	"labkeep/localrun/stack"
	"labkeep/localrun/virtsim"
	"labkeep/shared/portal"
)

// config is filled from LABKEEP_* variables (split_words: StateDir is
// LABKEEP_STATE_DIR; no unprefixed fallbacks); every field has a local
// default.
type config struct {
	StateDir    string `split_words:"true"`
	BinCache    string `split_words:"true"`
	DatabaseURL string `split_words:"true"`
	// VMs is what runs VM labs: kubevirt (real guests under software
	// emulation, a minute or more to boot) or virtsim (the stand-in).
	VMs              string        `default:"kubevirt"`
	VirtsimBootDelay time.Duration `split_words:"true" default:"5s"`
	QuotaSyncPeriod  time.Duration `split_words:"true" default:"5s"`
	LogLevel         slog.Level    `split_words:"true" default:"INFO"`
	// ReapInterval is how often the local scheduler calls reapTick (the
	// production schedule is every minute).
	ReapInterval time.Duration `split_words:"true" default:"1m"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "labkeep-run:", err)
		os.Exit(1)
	}
}

func run() error {
	var cfg config
	if err := envconfig.Process("labkeep", &cfg); err != nil {
		return err
	}
	if cfg.StateDir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			return fmt.Errorf("set LABKEEP_STATE_DIR: %w", err)
		}
		cfg.StateDir = filepath.Join(base, "labkeep", "state")
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return err
	}
	if cfg.VMs != "kubevirt" && cfg.VMs != "virtsim" {
		return fmt.Errorf("LABKEEP_VMS must be kubevirt or virtsim, got %q", cfg.VMs)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	start := time.Now()
	st, err := stack.Start(ctx, stack.Options{
		ControlPlane: controlplane.Options{BinCache: cfg.BinCache, QuotaSyncPeriod: cfg.QuotaSyncPeriod},
		VirtSim:      virtsim.Options{BootDelay: cfg.VirtsimBootDelay},
		Node:         node.Options{KubeVirt: cfg.VMs == "kubevirt"},
		DatabaseURL:  cfg.DatabaseURL,
		Logger:       log,
		Progress:     os.Stderr,
	})
	if err != nil {
		return err
	}
	defer func() {
		log.Info("stopping the local stack")
		if err := st.Stop(); err != nil {
			log.Error("stop", "err", err)
		}
		os.Remove(filepath.Join(cfg.StateDir, "kubeconfig"))
		os.Remove(filepath.Join(cfg.StateDir, "env"))
		os.Remove(filepath.Join(cfg.StateDir, devserve.EnvFileName))
	}()
	kubeconfig := filepath.Join(cfg.StateDir, "kubeconfig")
	if err := controlplane.WriteKubeconfig(kubeconfig, st.Admin(), "labkeep-admin"); err != nil {
		return err
	}
	settings := map[string]string{
		"KUBECONFIG":            kubeconfig,
		"LABKEEP_DATABASE_URL":  st.DSN(),
		"LABKEEP_APISERVER_URL": st.CP.APIServerURL,
	}
	var env strings.Builder
	for _, k := range []string{"KUBECONFIG", "LABKEEP_DATABASE_URL", "LABKEEP_APISERVER_URL"} {
		fmt.Fprintf(&env, "export %s=%q\n", k, settings[k])
	}
	if err := os.WriteFile(filepath.Join(cfg.StateDir, "env"), []byte(env.String()), 0o600); err != nil {
		return err
	}
	// The session functions, as the infra/ ServiceAccount.
	fns, err := devserve.Start(ctx, st, cfg.StateDir, log, os.Stdout)
	if err != nil {
		return fmt.Errorf("session functions: %w", err)
	}
	defer fns.Stop()
	if cfg.ReapInterval <= 0 {
		return fmt.Errorf("LABKEEP_REAP_INTERVAL must be positive, got %s", cfg.ReapInterval)
	}
	go fns.RunScheduler(ctx, cfg.ReapInterval)
	fmt.Printf("\nlabkeep local stack is up (in %s).\n", time.Since(start).Round(100*time.Millisecond))
	fmt.Printf("  state dir:  %s\n", cfg.StateDir)
	fmt.Printf("  kubectl:    kubectl --kubeconfig %s get vm,vmi -A\n", kubeconfig)
	fmt.Printf("  settings:   source %s\n", filepath.Join(cfg.StateDir, "env"))
	fmt.Printf("  admin CLI:  source %s && go run ./functions/cmd/labkeep admin sessions   (or reap --dry-run, close ID, status)\n", fns.EnvFile)
	if fns.App.Portal != nil {
		fmt.Printf("  portal:     %s%s (sign in with the student token above)\n", browserURL(fns.URL), portal.Prefix)
		fmt.Printf("  admin:      %s%sadmin.html (sign in with the admin token above; the instructor token books classes)\n", browserURL(fns.URL), portal.Prefix)
	}
	fmt.Printf("Press Ctrl-C to stop everything.\n\n")
	<-ctx.Done()
	return nil
}

// browserURL is u with an unspecified listen address (":8080" listens on
// [::]) replaced by localhost, which a browser opens and treats as a
// secure context (the portal's copy buttons need one).
func browserURL(u string) string {
	host, port, err := net.SplitHostPort(strings.TrimPrefix(u, "http://"))
	if err != nil || (host != "" && !net.ParseIP(host).IsUnspecified()) {
		return u
	}
	return "http://" + net.JoinHostPort("localhost", port)
}
