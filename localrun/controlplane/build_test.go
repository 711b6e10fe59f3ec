package controlplane

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Cached binaries are reused and only missing ones are built: no go command
// can succeed here (the context is already cancelled), so a case that needs
// no build must succeed without one, and a case that needs one must fail
// after announcing exactly the binaries it would build. A half-written
// ".partial" file from an interrupted build is never taken for a binary.
func TestEnsureBinariesBuildsOnlyWhatIsMissing(t *testing.T) {
	all := []string{"etcd", "kube-apiserver", "kube-controller-manager", "kubelet", "kube-scheduler", "kube-proxy", "coredns-v1.12.99"}
	for _, tc := range []struct {
		name    string
		present []string
		partial string // a leftover <name>.partial
		// announced is the first progress line; "" means no build at all.
		announced string
	}{
		{name: "all cached", present: all},
		{
			name:      "control plane cached, node binaries missing",
			present:   []string{"etcd", "kube-apiserver", "kube-controller-manager", "coredns-v1.12.99"},
			announced: "labkeep: building kubelet, kube-scheduler, kube-proxy v1.33.99",
		},
		{
			name:      "only the scheduler missing",
			present:   []string{"etcd", "kube-apiserver", "kube-controller-manager", "kubelet", "kube-proxy", "coredns-v1.12.99"},
			announced: "labkeep: building kube-scheduler v1.33.99",
		},
		{
			name:      "a partial apiserver is not a binary",
			present:   []string{"etcd", "kube-controller-manager", "kubelet", "kube-scheduler", "kube-proxy", "coredns-v1.12.99"},
			partial:   "kube-apiserver",
			announced: "labkeep: building kube-apiserver v1.33.99",
		},
		{
			name:      "only the cluster DNS missing",
			present:   []string{"etcd", "kube-apiserver", "kube-controller-manager", "kubelet", "kube-scheduler", "kube-proxy"},
			announced: "labkeep: building coredns v1.12.99",
		},
		{
			name:      "etcd missing",
			present:   []string{"kube-apiserver", "kube-controller-manager", "kubelet", "kube-scheduler", "kube-proxy", "coredns-v1.12.99"},
			announced: "labkeep: building etcd v3.5.99",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cache := t.TempDir()
			v := Versions{Kubernetes: "v1.33.99", Etcd: "v3.5.99", CoreDNS: "v1.12.99"}
			dir := filepath.Join(cache, "k8s-v1.33.99_etcd-v3.5.99")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, name := range tc.present {
				if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/true\n"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if tc.partial != "" {
				if err := os.WriteFile(filepath.Join(dir, tc.partial+".partial"), []byte("half"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			var progress bytes.Buffer
			b, err := EnsureBinaries(ctx, cache, v, &progress)
			if tc.announced == "" {
				if err != nil {
					t.Fatalf("cached binaries not reused: %v", err)
				}
				want := Binaries{
					Etcd: filepath.Join(dir, "etcd"), APIServer: filepath.Join(dir, "kube-apiserver"),
					ControllerManager: filepath.Join(dir, "kube-controller-manager"),
					Kubelet:           filepath.Join(dir, "kubelet"), Scheduler: filepath.Join(dir, "kube-scheduler"),
					Proxy: filepath.Join(dir, "kube-proxy"), CoreDNS: filepath.Join(dir, "coredns-v1.12.99"),
				}
				if diff := cmp.Diff(want, b); diff != "" || progress.Len() != 0 {
					t.Fatalf("binaries (-want +got):\n%s\nprogress %q", diff, progress.String())
				}
				return
			}
			if err == nil {
				t.Fatal("EnsureBinaries returned success with a binary missing")
			}
			first, _, _ := strings.Cut(progress.String(), "\n")
			if !strings.HasPrefix(first, tc.announced) {
				t.Fatalf("first progress line %q, want it to start with %q", first, tc.announced)
			}
		})
	}
}
