package infra_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// crdSource is a module holding real third-party CRDs, pinned by version
// and by the h1: hash of its content (as go.sum records it), and the CRD
// files in it.
type crdSource struct {
	module, version, sum string
	files                []string
}

// crdSources are the third-party CRDs labkeep's manifests are checked
// against, fetched through the Go module proxy. The go command verifies a
// download against the checksum database; the recorded sum refuses any
// other content for the same version too. A new version means a new sum:
// `go mod download -json <module>@<version>` prints it.
var crdSources = []crdSource{
	{
		// Knative Serving: Service, Configuration, Revision, Route.
		module: "knative.dev/serving", version: "v0.51.0", sum: "h1:yN2Q7eYqJgoPfZkATjoBZyGbZ2P1Qhns9HIMU4mF+to=",
		files: []string{
			"config/core/300-resources/service.yaml",
			"config/core/300-resources/configuration.yaml",
			"config/core/300-resources/revision.yaml",
			"config/core/300-resources/route.yaml",
		},
	},
	{
		// Knative Eventing's PingSource (sources.knative.dev/v1). The module
		// proxy here serves v0.50.0 but not v0.51; its pingsource.yaml is,
		// comments aside, the one of Eventing's main branch of June 2026
		// (commit 8cf4c4b67) the manifests were first checked against.
		module: "knative.dev/eventing", version: "v0.50.0", sum: "h1:4GSn7yyMLgpGUqU0vZjcyFKK0vSi3TtZXPVzb7HW7Ds=",
		files: []string{"config/core/resources/pingsource.yaml"},
	},
}

// notFetched are the third-party kinds labkeep's manifests use whose CRDs
// have no pinned, checksummed source here, with the reason; their objects
// are skipped (by dryRunAll, since their API group is not served).
var notFetched = map[string]string{
	"cilium.io/v1alpha1 TracingPolicy (infra/guardian/tetragon-block-renice.yaml)": "Tetragon's CRD YAML lives in the github.com/cilium/tetragon/pkg/k8s module, which the Go module proxy does not serve here; infra/tetragon_test.go checks the policy's shape instead",
}

// fetchCRDs downloads every source (or finds it in the module cache) and
// returns the paths of its CRD files. A download whose hash is not the
// recorded one is refused.
func fetchCRDs(ctx context.Context) ([]string, error) {
	var files []string
	for _, src := range crdSources {
		dir, err := downloadModule(ctx, src)
		if err != nil {
			return nil, err
		}
		for _, f := range src.files {
			p := filepath.Join(dir, filepath.FromSlash(f))
			if _, err := os.Stat(p); err != nil {
				return nil, fmt.Errorf("%s@%s has no %s: %w", src.module, src.version, f, err)
			}
			files = append(files, p)
		}
	}
	return files, nil
}

// downloadModule runs `go mod download -json` outside any module (so
// labkeep's go.mod is neither read nor changed) and returns the module's
// directory once its hash is checked.
func downloadModule(ctx context.Context, src crdSource) (string, error) {
	at := src.module + "@" + src.version
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", at)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var info struct{ Dir, Sum, Error string }
	if jerr := json.Unmarshal(out, &info); jerr != nil && err == nil {
		err = jerr
	}
	switch {
	case info.Error != "":
		return "", fmt.Errorf("go mod download %s: %s", at, info.Error)
	case err != nil:
		return "", fmt.Errorf("go mod download %s: %w: %s", at, err, strings.TrimSpace(stderr.String()))
	case info.Sum != src.sum:
		return "", fmt.Errorf("go mod download %s: hash %s, want %s: refusing CRDs from a module other than the pinned one", at, info.Sum, src.sum)
	case info.Dir == "":
		return "", errors.New("go mod download " + at + ": no directory")
	}
	return info.Dir, nil
}

// A module whose content hash is not the recorded one is refused, so the
// CRDs cannot change under an unchanged version.
func TestCRDSourceWithAnotherHashIsRefused(t *testing.T) {
	src := crdSources[0]
	src.sum = "h1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
	dir, err := downloadModule(context.Background(), src)
	if err == nil || !strings.Contains(err.Error(), "refusing CRDs from a module other than the pinned one") {
		t.Fatalf("got dir %q, error %v; want the download refused", dir, err)
	}
}
