package kubevirt_test

import (
	"context"
	"os"
	"testing"
	"time"

	"labkeep/localrun/controlplane"
	"labkeep/localrun/node"
)

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Logf("%s", p)
	return len(p), nil
}

// startNode starts a control plane and a node running KubeVirt.
func startNode(t *testing.T) (*controlplane.ControlPlane, *node.Node) {
	t.Helper()
	root, err := os.MkdirTemp("", "labkeep-kubevirttest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	cp, err := controlplane.Start(context.Background(), controlplane.Options{TempRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	start := time.Now()
	n, err := node.Start(context.Background(), node.Options{ControlPlane: cp, TempRoot: root, Progress: testWriter{t}, KubeVirt: true, NoWorkspaceImage: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Stop() })
	t.Logf("node with KubeVirt ready %s after Start", time.Since(start).Round(10*time.Millisecond))
	return cp, n
}
