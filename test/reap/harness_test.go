// Package reap_test runs the reaper on the real local stack: each test
// deploys the functions as production wires them (stacktest.Deploy, the
// ServiceAccount bound by infra/base/rbac.yaml), opens sessions through
// session.Service, injects faults in the transport to the real API server
// or as server-side refusals, and reads every assertion from the real
// cluster and database.
package reap_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"labkeep/localrun/stack"
	"labkeep/localrun/stacktest"
	"labkeep/localrun/virtsim"
	"labkeep/shared/reap"
	"labkeep/shared/session"
)

var st *stack.Stack

// The reaper's suite runs without a node: where it needs a Pod to end or
// turn Ready in a particular way (a node lost, an OOM kill, a drain) it
// writes the status a kubelet would report, which a real kubelet would
// overwrite. What a real node does with the same Pods is test/podlab's.
func TestMain(m *testing.M) {
	stacktest.Main(m, &st, stack.Options{NoNode: true, VirtSim: virtsim.Options{BootDelay: 300 * time.Millisecond}})
}

// backend is one environment's deployment, with the reaper suite's ways
// of driving it.
type backend struct {
	*stacktest.Deployment
	t *testing.T
}

// newBackend deploys the functions with o; unless o says otherwise, with
// room for many VMs and a client rate limit no test waits on, and quiet
// (the injected faults are logged as errors).
func newBackend(t *testing.T, o stacktest.Options) *backend {
	t.Helper()
	if o.MaxVMs == 0 {
		o.MaxVMs = 1000
	}
	if o.KubeQPS == 0 {
		o.KubeQPS, o.KubeBurst = 500, 1000
	}
	if o.DBConns == 0 {
		o.DBConns = 20
	}
	if o.Log == nil {
		o.Log = stacktest.Discard()
	}
	return &backend{Deployment: stacktest.Deploy(t, st, o), t: t}
}

// open opens a session of lab for student through the Service and waits
// until it is running.
func (b *backend) open(student, lab string) session.Session {
	b.t.Helper()
	ctx := context.Background()
	opened, err := b.App.Sessions.Open(ctx, student, lab, "")
	if err != nil {
		b.t.Fatalf("open %s for %s: %v", lab, student, err)
	}
	s := *opened.Session
	stacktest.Eventually(b.t, 30*time.Second, func() (bool, string) {
		got, err := b.App.Sessions.Get(ctx, student, s.ID)
		if err != nil {
			b.t.Fatal(err)
		}
		s = *got.Session
		return s.Status == session.StatusRunning, fmt.Sprintf("session %s is %s", s.ID, s.Status)
	})
	return s
}

// run is one scheduled reaper run that must succeed.
func (b *backend) run() reap.Report {
	b.t.Helper()
	r, err := b.App.Reaper.RunOnce(context.Background(), reap.TriggerSchedule)
	if err != nil {
		b.t.Fatalf("reap run: %v", err)
	}
	return r
}

// status is session id's stored status.
func (b *backend) status(id string) session.Status {
	b.t.Helper()
	return b.Session(id).Status
}
