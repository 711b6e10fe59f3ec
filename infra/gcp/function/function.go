// Package gcf is the package Google's Go buildpack builds for Cloud
// Functions: it must sit at the source root and import the functions
// framework's functions package, which selects the buildpack's declarative
// main (the function registers itself: labkeep/functions/gcf registers
// "Labkeep" in its init).
//
// The same binary is the kubeconfig's credential plugin (infra/gcp's
// kubeconfig runs /proc/self/exe gke-exec-credential): started with that
// argument it prints a client.authentication.k8s.io ExecCredential
// holding the function's own Google access token, from the metadata
// server, and exits before the framework starts. GKE accepts the token as
// the function's service account, which infra/gcp/rbac.yaml lets
// impersonate the labkeep-functions ServiceAccount and nothing else.
// Nothing long-lived is stored: client-go runs the plugin again when the
// token's expirationTimestamp has passed.
package gcf

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	_ "github.com/GoogleCloudPlatform/functions-framework-go/functions"

	_ "labkeep/functions/gcf"
)

// PluginArg is the argument that makes the binary the credential plugin.
const PluginArg = "gke-exec-credential"

// metadataHostEnv overrides the metadata server's address, as Google's
// client libraries read it (tests point it at a local server).
const metadataHostEnv = "GCE_METADATA_HOST"

// expiryMargin is how long before the token's own end client-go is told
// it expires, so no request leaves with a token about to end.
const expiryMargin = time.Minute

func init() {
	if len(os.Args) == 2 && os.Args[1] == PluginArg {
		os.Exit(runPlugin(os.Stdout, os.Stderr))
	}
}

func runPlugin(stdout, stderr io.Writer) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	host := os.Getenv(metadataHostEnv)
	if host == "" {
		host = "metadata.google.internal"
	}
	cred, err := execCredential(ctx, http.DefaultClient, "http://"+host, time.Now)
	if err != nil {
		fmt.Fprintln(stderr, "gke-exec-credential:", err)
		return 1
	}
	if _, err := stdout.Write(cred); err != nil {
		fmt.Fprintln(stderr, "gke-exec-credential:", err)
		return 1
	}
	return 0
}

// execCredential asks the metadata server at base for the default service
// account's access token and returns it as an ExecCredential.
func execCredential(ctx context.Context, c *http.Client, base string, now func() time.Time) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/computeMetadata/v1/instance/service-accounts/default/token", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Metadata-Flavor", "Google")
	res, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metadata server: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(res.Body, 512))
		return nil, fmt.Errorf("metadata server answered %s: %s", res.Status, body)
	}
	var tok struct {
		AccessToken string `json:"access_token"`
		ExpiresIn   int    `json:"expires_in"`
	}
	if err := json.NewDecoder(io.LimitReader(res.Body, 1<<16)).Decode(&tok); err != nil {
		return nil, fmt.Errorf("metadata server's token: %w", err)
	}
	if tok.AccessToken == "" || tok.ExpiresIn <= 0 {
		return nil, errors.New("metadata server's token has no access_token or expires_in")
	}
	expires := now().Add(time.Duration(tok.ExpiresIn)*time.Second - expiryMargin).UTC()
	return json.Marshal(map[string]any{
		"apiVersion": "client.authentication.k8s.io/v1",
		"kind":       "ExecCredential",
		"status": map[string]any{
			"token":               tok.AccessToken,
			"expirationTimestamp": expires.Format(time.RFC3339),
		},
	})
}
