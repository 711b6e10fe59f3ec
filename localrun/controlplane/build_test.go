package controlplane

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

// Cached binaries are reused: no go command runs (there is none on PATH
// here, and the context is already cancelled), and a half-written
// ".partial" file from an interrupted build is never taken for a binary.
func TestEnsureBinariesReusesCache(t *testing.T) {
	cache := t.TempDir()
	v := Versions{Kubernetes: "v1.33.99", Etcd: "v3.5.99"}
	dir := filepath.Join(cache, "k8s-v1.33.99_etcd-v3.5.99")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"etcd", "kube-apiserver", "kube-controller-manager"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/true\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var progress bytes.Buffer
	b, err := EnsureBinaries(ctx, cache, v, &progress)
	if err != nil {
		t.Fatalf("cached binaries not reused: %v", err)
	}
	if b.APIServer != filepath.Join(dir, "kube-apiserver") || progress.Len() != 0 {
		t.Fatalf("got %+v, progress %q", b, progress.String())
	}

	// A partial apiserver means a build is needed; with a cancelled context
	// that build fails rather than returning the partial file.
	os.Remove(filepath.Join(dir, "kube-apiserver"))
	os.WriteFile(filepath.Join(dir, "kube-apiserver.partial"), []byte("half"), 0o755)
	if _, err := EnsureBinaries(ctx, cache, v, &progress); err == nil {
		t.Fatal("EnsureBinaries returned success with the apiserver missing")
	}
}
