// Package gcf registers the session functions with the Google Cloud
// Functions framework as the HTTP function "Labkeep" (deploy with
// --entry-point=Labkeep; Cloud Scheduler calls /reapTick on it over HTTP).
// It holds no domain logic: it serves the same http.Handler as Knative and
// Lambda, built from the same LABKEEP_* settings.
package gcf

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"
	"github.com/kelseyhightower/envconfig"

	"labkeep/functions/app"
)

// FunctionName is the entry point name registered with the framework.
const FunctionName = "Labkeep"

func init() {
	functions.HTTP(FunctionName, serve)
}

var (
	once    sync.Once
	handler http.Handler
	initErr error
)

// Init reads the settings and builds the application once; the function
// instance calls it on its first request, and a main may call it first to
// fail at start. The error names the LABKEEP_* variable at fault.
func Init() error {
	once.Do(func() {
		cfg := app.DefaultConfig()
		if initErr = envconfig.Process(app.EnvPrefix, &cfg); initErr != nil {
			return
		}
		log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
		a, err := app.Build(context.Background(), cfg, time.Now, log)
		if err != nil {
			initErr = err
			return
		}
		handler = a.Handler()
	})
	return initErr
}

func serve(w http.ResponseWriter, r *http.Request) {
	if err := Init(); err != nil {
		// The instance cannot work at all; say why in the log and answer
		// with the same JSON error shape as every other failure.
		slog.Error("labkeep configuration", "err", err)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintln(w, `{"error":{"code":"internal","message":"function is misconfigured; see its log"}}`)
		return
	}
	handler.ServeHTTP(w, r)
}
