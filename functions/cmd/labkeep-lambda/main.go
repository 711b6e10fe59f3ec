// Command labkeep-lambda runs the session functions on AWS Lambda (HTTP API
// or function URL for the portal, an EventBridge schedule for reapTick).
// Settings are the same LABKEEP_* variables as everywhere (app.Config); an
// invalid one fails the cold start with a message naming it.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	awslambda "github.com/aws/aws-lambda-go/lambda"

	"labkeep/functions/app"
	"labkeep/functions/lambda"
)

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	cfg, err := app.FromEnv(os.LookupEnv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "labkeep-lambda:", err)
		os.Exit(1)
	}
	a, err := app.Build(context.Background(), cfg, time.Now, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "labkeep-lambda:", err)
		os.Exit(1)
	}
	awslambda.Start(lambda.Adapter{Handler: a.Handler(), ScheduledPath: "/reapTick", SchedulerToken: cfg.SchedulerToken}.Invoke)
}
