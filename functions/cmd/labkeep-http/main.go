// Command labkeep-http serves the session functions over HTTP: the
// Knative Service (or any on-prem Deployment) entry point. All settings
// come from LABKEEP_* environment variables (see app.Config); an invalid
// setting stops it at start with a message naming the variable.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"labkeep/functions/app"
)

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(log); err != nil {
		fmt.Fprintln(os.Stderr, "labkeep-http:", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger) error {
	cfg, err := app.FromEnv(os.LookupEnv)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	a, err := app.Build(ctx, cfg, time.Now, log)
	if err != nil {
		return err
	}
	defer a.Close()
	servers := []*http.Server{{Addr: cfg.HTTPAddr, Handler: a.Handler(), ReadHeaderTimeout: 10 * time.Second}}
	if cfg.MetricsAddr != "" {
		servers = append(servers, metricsServer(cfg.MetricsAddr, a.MetricsHandler()))
	}
	errc := make(chan error, len(servers))
	for _, srv := range servers {
		go func() { errc <- srv.ListenAndServe() }()
	}
	log.Info("serving", "addr", cfg.HTTPAddr, "metricsAddr", cfg.MetricsAddr, "env", cfg.Env, "namespace", cfg.Kube.Namespace)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, srv := range servers {
		if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	return nil
}

// metricsServer serves metrics as GET /metrics on addr
// (LABKEEP_METRICS_ADDR): the address monitoring scrapes, never published
// with the public handler.
func metricsServer(addr string, metrics http.Handler) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics)
	return &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
}
