// Command labkeep-gcf runs the Cloud Functions build of the session
// functions locally or on Cloud Run through the functions framework
// (PORT, default 8080). It builds the application before serving, so an
// invalid LABKEEP_* setting fails at start with a message naming it.
package main

import (
	"fmt"
	"os"

	"github.com/GoogleCloudPlatform/functions-framework-go/funcframework"

	"labkeep/functions/gcf"
)

func main() {
	if err := gcf.Init(); err != nil {
		fmt.Fprintln(os.Stderr, "labkeep-gcf:", err)
		os.Exit(1)
	}
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	if os.Getenv("FUNCTION_TARGET") == "" {
		os.Setenv("FUNCTION_TARGET", gcf.FunctionName)
	}
	if err := funcframework.Start(port); err != nil {
		fmt.Fprintln(os.Stderr, "labkeep-gcf:", err)
		os.Exit(1)
	}
}
