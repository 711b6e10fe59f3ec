// Package stack starts the whole local environment labkeep runs against — a
// real Kubernetes control plane with the KubeVirt CRDs, a real node
// (kubelet, kube-scheduler, containerd) on which Pods run, real KubeVirt on
// it or the virtsim stand-in for virt-controller, and a throwaway
// PostgreSQL — as one unit,
// so tests and `make run` share exactly the same set-up code.
package stack

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"

	"k8s.io/client-go/rest"

	"labkeep/localrun/childproc"
	"labkeep/localrun/controlplane"
	"labkeep/localrun/node"
	"labkeep/localrun/pgtest"
	"labkeep/localrun/virtsim"
)

// Options configures Start.
type Options struct {
	ControlPlane controlplane.Options
	VirtSim      virtsim.Options
	// Node configures the node; its ControlPlane, TempRoot, BinCache and
	// Progress are filled from the stack's.
	Node node.Options
	// NoNode starts no node: Pods are created but never run (tests of the
	// control plane alone, which then start faster).
	NoNode bool
	// DatabaseURL, if set, is used instead of starting a PostgreSQL server.
	DatabaseURL string
	// NoVirtSim leaves virt-controller's job undone (tests of the bare
	// control plane). virtsim never runs beside real KubeVirt
	// (Node.KubeVirt).
	NoVirtSim bool
	// StopOnSignal stops the whole stack on SIGINT/SIGTERM (for test
	// binaries; see childproc.CleanupOnSignal).
	StopOnSignal bool
	Logger       *slog.Logger
	Progress     io.Writer
}

// Stack is a running local environment.
type Stack struct {
	CP   *controlplane.ControlPlane
	PG   *pgtest.Server
	Sim  *virtsim.Sim // nil with Options.NoVirtSim or Node.KubeVirt
	Node *node.Node   // nil with Options.NoNode
	// KubeVirt is true when real KubeVirt runs on the node
	// (Options.Node.KubeVirt): VM labs boot real guests, so a catalog's VM
	// labs must fit the node and name a guest disk it has (LocalVMLabs).
	KubeVirt bool

	unsignal func()
	cancel   context.CancelFunc
	simDone  chan error
	stopOnce sync.Once
	// mu orders Start's assignments before a Stop that a signal starts
	// on another goroutine.
	mu sync.Mutex
}

// set runs f, which assigns the stack's parts, under mu.
func (s *Stack) set(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f()
}

// Admin is the control plane's system:masters config.
func (s *Stack) Admin() *rest.Config { return s.CP.Admin }

// DSN is the PostgreSQL connection string.
func (s *Stack) DSN() string { return s.PG.DSN }

// Start brings everything up, or nothing: on error what was started is
// stopped again.
func Start(ctx context.Context, opts Options) (st *Stack, err error) {
	if opts.Progress != nil && opts.ControlPlane.Progress == nil {
		opts.ControlPlane.Progress = opts.Progress
	}
	if opts.Logger != nil && opts.VirtSim.Logger == nil {
		opts.VirtSim.Logger = opts.Logger
	}
	st = &Stack{}
	if opts.StopOnSignal {
		unsignal := childproc.CleanupOnSignal(func() { st.Stop() })
		st.set(func() { st.unsignal = unsignal })
	}
	defer func() {
		if err != nil {
			st.Stop()
			st = nil
		}
	}()
	type pgResult struct {
		s   *pgtest.Server
		err error
	}
	pgc := make(chan pgResult, 1)
	go func() { // PostgreSQL starts while the control plane does
		s, err := pgtest.Start(ctx, opts.ControlPlane.TempRoot, opts.DatabaseURL)
		pgc <- pgResult{s, err}
	}()
	cp, err := controlplane.Start(ctx, opts.ControlPlane)
	r := <-pgc
	st.set(func() { st.CP, st.PG = cp, r.s })
	if err != nil {
		return st, err
	}
	if r.err != nil {
		return st, r.err
	}
	if !opts.NoNode {
		no := opts.Node
		no.ControlPlane = st.CP
		no.TempRoot = opts.ControlPlane.TempRoot
		no.BinCache = opts.ControlPlane.BinCache
		if no.Progress == nil {
			no.Progress = opts.ControlPlane.Progress
		}
		nd, err := node.Start(ctx, no)
		st.set(func() { st.Node, st.KubeVirt = nd, nd != nil && no.KubeVirt })
		if err != nil {
			return st, err
		}
	}
	if opts.NoVirtSim || opts.Node.KubeVirt {
		return st, nil
	}
	sim, err := virtsim.New(st.CP.Admin, opts.VirtSim)
	if err != nil {
		return st, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	simDone := make(chan error, 1)
	st.set(func() { st.Sim, st.cancel, st.simDone = sim, cancel, simDone })
	go func() { simDone <- sim.Run(runCtx) }()
	select {
	case <-sim.Synced():
		return st, nil
	case err := <-simDone:
		simDone <- err // for Stop
		if err == nil {
			err = errors.New("virtsim stopped before its caches synced")
		}
		return st, err
	case <-ctx.Done():
		return st, ctx.Err()
	}
}

// Stop stops virtsim, the node (every container with it), the control
// plane and PostgreSQL and removes their files. Safe to call more than once.
func (s *Stack) Stop() error {
	var errs []error
	s.stopOnce.Do(func() {
		s.mu.Lock()
		unsignal, cancel, simDone, nd, cp, pg := s.unsignal, s.cancel, s.simDone, s.Node, s.CP, s.PG
		s.mu.Unlock()
		if unsignal != nil {
			unsignal()
		}
		if cancel != nil {
			cancel()
			errs = append(errs, <-simDone)
		}
		if nd != nil {
			errs = append(errs, nd.Stop())
		}
		if cp != nil {
			cp.Stop()
		}
		if pg != nil {
			errs = append(errs, pg.Stop())
		}
	})
	return errors.Join(errs...)
}
