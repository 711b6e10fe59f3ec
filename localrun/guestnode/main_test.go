package guestnode_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"labkeep/localrun/controlplane"
	"labkeep/localrun/guestnode"
	"labkeep/localrun/guestvm"
	"labkeep/localrun/stack"
)

// One stack without a node of its own (control plane and PostgreSQL, for
// the session functions) and one guest node joined to it serve every test
// of the package: the guest takes about a minute to boot and join.
var (
	st        *stack.Stack
	cp        *controlplane.ControlPlane
	node      *guestnode.Node
	clientset *kubernetes.Clientset
	joined    time.Duration
	startErr  error
)

func TestMain(m *testing.M) {
	cache, err := controlplane.DefaultCacheDir(os.Getenv("LABKEEP_BIN_CACHE"))
	if err == nil {
		_, err = guestvm.Kernel(cache)
	}
	if err != nil && os.Getenv("CI") == "" {
		// RequireKernel skips each test with this reason.
		os.Exit(m.Run())
	}
	code := func() int {
		ctx := context.Background()
		if st, startErr = stack.Start(ctx, stack.Options{NoNode: true, NoVirtSim: true}); startErr != nil {
			return m.Run()
		}
		defer st.Stop()
		cp = st.CP
		opts := guestnode.Options{ControlPlane: cp, Scheduler: true}
		if os.Getenv("GUESTNODE_VERBOSE") != "" {
			opts.Progress = os.Stderr
		}
		start := time.Now()
		if node, startErr = guestnode.Start(ctx, opts); startErr != nil {
			return m.Run()
		}
		joined = time.Since(start)
		defer func() {
			if err := node.Stop(); err != nil {
				fmt.Fprintf(os.Stderr, "stopping the guest node: %v\n", err)
			}
		}()
		clientset, startErr = kubernetes.NewForConfig(cp.Admin)
		return m.Run()
	}()
	os.Exit(code)
}

// started returns the shared node, or fails the test with why there is
// none.
func started(t *testing.T) *guestnode.Node {
	t.Helper()
	guestvm.RequireKernel(t)
	if startErr != nil {
		t.Fatalf("guest node: %v", startErr)
	}
	return node
}
