package guard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"labkeep/guardian/alert"
	"labkeep/guardian/cgroupfs"
	"labkeep/guardian/killer"
	"labkeep/guardian/sched"
	"labkeep/guardian/victim"
)

// The fakes below stand in for the kernel so the wiring between the loops
// and the pure rules can be tested without cgroups; the end-to-end tests in
// guardian/e2e show the same behaviour on the real kernel.

type fakeCgroup struct {
	mu      sync.Mutex
	table   *fakeProcs
	usage   uint64
	shmem   uint64
	limit   uint64
	pidsMax int
	events  cgroupfs.MemoryEvents
	stall   float64 // memory.pressure's some avg10, as a share
	frozen  bool
	freezes int
	// freezeStuck: a freeze never completes (Freeze waits out its context),
	// as on the emulated v2 node beside a large bomb.
	freezeStuck bool
	setMemory   [][2]uint64
	setMemErr   error
	handleOOM   bool
	rtErr       error
	cpuWeight   int
	weightErr   error // SetCPUWeight is refused
	// log records pids.max writes, freezes, thaws and kills in order.
	log         []string
	freedOnKill uint64
	gone        bool  // the container ended: the cgroup lists no process
	limitErr    error // reading the hard limit fails (the cgroup went away)
	name        string
}

var _ cgroupfs.Cgroup = (*fakeCgroup)(nil)

func (c *fakeCgroup) Version() int { return 2 }
func (c *fakeCgroup) String() string {
	if c.name == "" {
		return "fake"
	}
	return c.name
}
func (c *fakeCgroup) Procs() ([]int, error) {
	c.mu.Lock()
	gone := c.gone
	c.mu.Unlock()
	if gone {
		return nil, nil
	}
	return c.table.pids(), nil
}
func (c *fakeCgroup) MemoryUsage() (uint64, uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.usage, c.shmem, nil
}
func (c *fakeCgroup) MemoryLimit() (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.limit, c.limitErr
}
func (c *fakeCgroup) SetMemory(high, max uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.setMemErr != nil {
		return c.setMemErr
	}
	c.setMemory = append(c.setMemory, [2]uint64{high, max})
	c.limit = max / 4096 * 4096
	return nil
}
func (c *fakeCgroup) HandleOOM() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.handleOOM = true
	return nil
}
func (c *fakeCgroup) MemoryEvents() (cgroupfs.MemoryEvents, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.events, nil
}
func (c *fakeCgroup) MemoryStall() (float64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stall, nil
}
func (c *fakeCgroup) WatchMemory(ctx context.Context, _ []uint64) (<-chan struct{}, error) {
	return nil, errors.New("fake: no notifications")
}
func (c *fakeCgroup) SetPidsMax(n int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pidsMax = n
	c.log = append(c.log, fmt.Sprintf("pids.max %d", n))
	return nil
}
func (c *fakeCgroup) PidsLimit() (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pidsMax, nil
}
func (c *fakeCgroup) PidsRefused() (uint64, error) { return 0, nil }
func (c *fakeCgroup) PidsCurrent() (int, error)    { return len(c.table.pids()), nil }
func (c *fakeCgroup) WatchPids(context.Context) (<-chan struct{}, error) {
	return nil, errors.New("fake: no notifications")
}
func (c *fakeCgroup) Freeze(ctx context.Context) error {
	c.mu.Lock()
	c.frozen = true
	c.freezes++
	c.log = append(c.log, "freeze")
	stuck := c.freezeStuck
	c.mu.Unlock()
	if stuck {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}
func (c *fakeCgroup) Thaw() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.frozen = false
	c.log = append(c.log, "thaw")
	return nil
}
func (c *fakeCgroup) CPUUsage() (time.Duration, error) { return 0, nil }
func (c *fakeCgroup) CPUs() (float64, error)           { return 1, nil }
func (c *fakeCgroup) GrantRT(int) error                { return c.rtErr }

func (c *fakeCgroup) CPUWeight() (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cpuWeight, nil
}
func (c *fakeCgroup) SetCPUWeight(w int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.weightErr != nil {
		return c.weightErr
	}
	c.cpuWeight = w
	return nil
}

// fakeWorkspace hands out the cgroup it holds; none (nil) is "not found".
// own is guardian's own cgroup; none (nil) is "not in a Pod".
type fakeWorkspace struct {
	mu    sync.Mutex
	cg    *fakeCgroup
	own   *fakeCgroup
	finds int
}

func (w *fakeWorkspace) Own() (cgroupfs.Cgroup, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.own == nil {
		return nil, nil
	}
	return w.own, nil
}

func (w *fakeWorkspace) Find() (cgroupfs.Cgroup, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.finds++
	if w.cg == nil {
		return nil, cgroupfs.ErrNotFound
	}
	return w.cg, nil
}

func (w *fakeWorkspace) set(cg *fakeCgroup) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cg = cg
}

type fakeProcs struct {
	mu        sync.Mutex
	procs     map[int]victim.Process
	oom       map[int]int
	oomErr    error
	listener  int // pid owning the SSH socket, 0 for none
	cgroup    *fakeCgroup
	oomWrites []int
}

func (f *fakeProcs) pids() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []int
	for pid := range f.procs {
		out = append(out, pid)
	}
	slices.Sort(out)
	return out
}

func (f *fakeProcs) Snapshot(pids []int) ([]victim.Process, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []victim.Process
	for _, pid := range pids {
		if p, ok := f.procs[pid]; ok {
			out = append(out, p)
		}
	}
	return out, nil
}
func (f *fakeProcs) Process(pid int) (victim.Process, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := f.procs[pid]; ok {
		return p, nil
	}
	return victim.Process{}, killer.ErrGone
}
func (f *fakeProcs) ListeningInodes(int) (map[uint64]bool, error) {
	return map[uint64]bool{1: true}, nil
}
func (f *fakeProcs) SocketOwner(pids []int, _ map[uint64]bool) (int, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.listener != 0 && slices.Contains(pids, f.listener) {
		if _, ok := f.procs[f.listener]; ok {
			return f.listener, true
		}
	}
	return 0, false
}
func (f *fakeProcs) OOMScoreAdj(pid int) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.oom[pid], nil
}
func (f *fakeProcs) SetOOMScoreAdj(pid, adj int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.oomErr != nil {
		return f.oomErr
	}
	f.oom[pid] = adj
	f.oomWrites = append(f.oomWrites, pid)
	return nil
}

// kill removes a process and frees its RSS from the fake cgroup.
func (f *fakeProcs) kill(id victim.Identity) error {
	f.mu.Lock()
	p, ok := f.procs[id.PID]
	if !ok || p.Identity != id {
		f.mu.Unlock()
		return killer.ErrGone
	}
	delete(f.procs, id.PID)
	f.mu.Unlock()
	f.cgroup.mu.Lock()
	f.cgroup.usage -= min(f.cgroup.usage, p.RSS)
	f.cgroup.mu.Unlock()
	return nil
}

type signal struct {
	PID   int
	Sig   unix.Signal
	Grace time.Duration
}

type fakeKiller struct {
	table *fakeProcs
	sched *fakeSched
	mu    sync.Mutex
	calls []signal
	// policy is each signalled process's scheduling policy when its first
	// signal came.
	policy map[int]int
}

// record notes a signal and the target's scheduling policy at its first.
func (k *fakeKiller) record(pid int, sig unix.Signal, grace time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls = append(k.calls, signal{pid, sig, grace})
	if _, seen := k.policy[pid]; !seen && k.sched != nil {
		if k.policy == nil {
			k.policy = map[int]int{}
		}
		k.policy[pid] = k.sched.attrs[pid].Policy
	}
}

func (k *fakeKiller) Signal(id victim.Identity, sig unix.Signal) error {
	k.record(id.PID, sig, -1)
	if c := k.table.cgroup; c != nil {
		c.mu.Lock()
		switch sig {
		case unix.SIGKILL:
			c.log = append(c.log, "kill")
		case unix.SIGSTOP, unix.SIGCONT:
			c.log = append(c.log, fmt.Sprintf("%v %d", sig, id.PID))
		}
		c.mu.Unlock()
	}
	if sig == unix.SIGKILL || sig == unix.SIGTERM {
		return k.table.kill(id)
	}
	return nil
}
func (k *fakeKiller) Terminate(_ context.Context, id victim.Identity, p killer.Plan) (bool, error) {
	sig := unix.SIGTERM
	if p.Grace == 0 {
		sig = unix.SIGKILL
	}
	k.record(id.PID, sig, p.Grace)
	err := k.table.kill(id)
	if p.AfterFirstSignal != nil {
		p.AfterFirstSignal()
	}
	return sig == unix.SIGKILL, err
}

type fakeSched struct {
	attrs map[int]sched.Attr
	rrErr error
}

func (s *fakeSched) Get(pid int) (sched.Attr, error) { return s.attrs[pid], nil }
func (s *fakeSched) SetRR(pid, prio int) error {
	if s.rrErr != nil {
		return s.rrErr
	}
	s.attrs[pid] = sched.Attr{Policy: unix.SCHED_RR, ResetOnFork: true, Priority: prio}
	return nil
}
func (s *fakeSched) SetIdleProcess(pid int) error {
	s.attrs[pid] = sched.Attr{Policy: unix.SCHED_IDLE}
	return nil
}
func (s *fakeSched) SetNormalProcess(pid int) error {
	s.attrs[pid] = sched.Attr{Policy: unix.SCHED_NORMAL}
	return nil
}
func (s *fakeSched) SetNice(pid, nice int) error {
	a := s.attrs[pid]
	a.Nice = nice
	s.attrs[pid] = a
	return nil
}

type fakeProber struct{ err error }

func (p fakeProber) Probe(context.Context) (string, time.Duration, error) {
	return "SSH-2.0-fake", time.Millisecond, p.err
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

const mib = 1 << 20

type rig struct {
	g      *Guardian
	cg     *fakeCgroup
	procs  *fakeProcs
	killer *fakeKiller
	sched  *fakeSched
	clock  *clock
	alerts *alert.Aggregator
	store  FileStore
	ws     *fakeWorkspace
}

// workspaceProcs is a workspace of init (oldest), the sshd listener, a
// live connection, the user's shell and two jobs, one renamed "sshd".
func workspaceProcs() map[int]victim.Process {
	m := map[int]victim.Process{}
	for _, p := range []victim.Process{
		{Identity: victim.Identity{PID: 7, StartTime: 100, Exe: "/usr/bin/sleep"}, RSS: 1 * mib},
		{Identity: victim.Identity{PID: 20, StartTime: 110, Exe: "/usr/sbin/sshd"}, PPID: 7, RSS: 8 * mib},
		{Identity: victim.Identity{PID: 30, StartTime: 200, Exe: "/usr/sbin/sshd"}, PPID: 20, RSS: 9 * mib},
		{Identity: victim.Identity{PID: 31, StartTime: 201, Exe: "/usr/bin/bash"}, PPID: 30, RSS: 4 * mib},
		{Identity: victim.Identity{PID: 40, StartTime: 300, Exe: "/usr/bin/python3"}, PPID: 31, RSS: 700 * mib, Comm: "sshd"},
		{Identity: victim.Identity{PID: 41, StartTime: 301, Exe: "/usr/bin/python3"}, PPID: 31, RSS: 200 * mib},
	} {
		m[p.PID] = p
	}
	return m
}

// newRig builds and starts a guardian over workspaceProcs, with its state in
// a fresh file.
func newRig(t *testing.T, cfg Config) *rig { return newRigWith(t, cfg, func(*rig) {}) }

// newRigWith is newRig with a hook that adjusts the fakes before Start.
func newRigWith(t *testing.T, cfg Config, hook func(*rig)) *rig {
	t.Helper()
	r := newStartedRig(t, cfg, hook)
	if err := r.g.Attach(context.Background(), r.cg); err != nil {
		t.Fatal(err)
	}
	return r
}

// newStartedRig builds and starts a guardian whose workspace has no
// cgroup yet (r.ws hands out none until set).
func newStartedRig(t *testing.T, cfg Config, hook func(*rig)) *rig {
	t.Helper()
	clk := &clock{time.Unix(1_000_000, 0)}
	table := &fakeProcs{oom: map[int]int{}, listener: 20, procs: workspaceProcs()}
	cg := &fakeCgroup{table: table, limit: 1024 * mib, usage: 500 * mib}
	table.cgroup = cg
	sch := &fakeSched{attrs: map[int]sched.Attr{}}
	r := &rig{cg: cg, procs: table, killer: &fakeKiller{table: table, sched: sch}, sched: sch, clock: clk, ws: &fakeWorkspace{}}
	r.alerts = alert.New(alert.Config{Window: time.Second}, clk.now, nil, nil)
	hook(r)
	if r.store.Path == "" {
		r.store.Path = filepath.Join(t.TempDir(), "state.json")
	}
	g, err := New(cfg, Deps{Workspace: r.ws, Procs: table, Killer: r.killer, Scheduler: r.sched, Prober: fakeProber{},
		Alerts: r.alerts, Metrics: NewMetrics(prometheus.NewRegistry()), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		State: r.store, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	r.g = g
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return r
}

func testConfig() Config {
	c := Defaults()
	c.MemoryLimit = 1024 * mib
	c.SSHPort = 2222
	return c
}

func (r *rig) alertKinds() []string {
	var out []string
	for _, a := range r.alerts.Recent() {
		out = append(out, a.Kind)
	}
	return out
}

func (r *rig) has(kind string) bool { return slices.Contains(r.alertKinds(), kind) }

func (r *rig) killed() []int {
	r.killer.mu.Lock()
	defer r.killer.mu.Unlock()
	var out []int
	for _, c := range r.killer.calls {
		if !slices.Contains(out, c.PID) {
			out = append(out, c.PID)
		}
	}
	return out
}

func TestStartAppliesKernelSettingsFirst(t *testing.T) {
	r := newRig(t, testConfig())
	m := float64(1024 * mib)
	want := [][2]uint64{{uint64(0.90 * m), uint64(0.98 * m)}}
	if diff := cmp.Diff(want, r.cg.setMemory); diff != "" {
		t.Errorf("SetMemory calls (-want +got):\n%s", diff)
	}
	if r.cg.pidsMax != 4096 || !r.cg.handleOOM {
		t.Errorf("pids.max = %d, OOM handled = %v", r.cg.pidsMax, r.cg.handleOOM)
	}
	if a := r.sched.attrs[20]; !a.IsRR(1) {
		t.Errorf("listener scheduling = %+v; want SCHED_RR 1", a)
	}
	want2 := map[int]int{7: -1000, 20: -1000}
	for pid, adj := range want2 {
		if r.procs.oom[pid] != adj {
			t.Errorf("oom_score_adj of %d = %d; want %d", pid, r.procs.oom[pid], adj)
		}
	}
	for _, pid := range []int{30, 31, 40, 41} {
		if r.procs.oom[pid] != 0 {
			t.Errorf("unprotected/session pid %d got oom_score_adj %d", pid, r.procs.oom[pid])
		}
	}
}

func TestMemory(t *testing.T) {
	tests := []struct {
		name       string
		usage      uint64
		shmem      uint64
		underOOM   bool
		priorKills int // kills already recorded just before
		wantKilled []int
		wantAlerts []string
		wantGrace  time.Duration
	}{
		{"below the alert threshold nothing happens", 900 * mib, 0, false, 0, nil, nil, 0},
		{"at 95% an alert, no kill", 975 * mib, 0, false, 0, nil, []string{"memory-high"}, 0},
		{"at the kill threshold the largest unprotected process goes, SIGTERM first", 1000 * mib, 0, false, 0, []int{40}, []string{"memory-high", "memory-kill"}, 5 * time.Second},
		{"tmpfs holding the memory: alert, no kill", 1000 * mib, 990 * mib, false, 0, nil, []string{"memory-high", "memory-unfreeable"}, 0},
		{"kill loop: after 3 kills in 30s threshold kills pause", 1000 * mib, 0, false, 3, nil, []string{"memory-high", "memory-kill-paused"}, 0},
		{"at the hard limit the pause yields and SIGKILL comes at once", 1003 * mib, 0, true, 3, []int{40}, []string{"memory-high", "memory-kill"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, testConfig())
			for i := 0; i < tt.priorKills; i++ {
				r.g.st.Budget.Record(r.clock.t.Add(-time.Duration(i) * time.Second))
			}
			r.cg.usage, r.cg.shmem = tt.usage, tt.shmem
			r.cg.events.UnderOOM = tt.underOOM
			before := r.alertKinds()
			r.g.checkMemory(context.Background())
			if diff := cmp.Diff(tt.wantKilled, r.killed()); diff != "" {
				t.Errorf("killed (-want +got):\n%s", diff)
			}
			var got []string
			for _, k := range r.alertKinds()[len(before):] {
				got = append(got, k)
			}
			if diff := cmp.Diff(tt.wantAlerts, got); diff != "" {
				t.Errorf("alerts (-want +got):\n%s", diff)
			}
			if len(tt.wantKilled) > 0 {
				first := r.killer.calls[0]
				wantSig := unix.SIGTERM
				if tt.underOOM {
					wantSig = unix.SIGKILL
				}
				if first.Sig != wantSig {
					t.Errorf("first signal = %v; want %v", first.Sig, wantSig)
				}
				if !tt.underOOM && r.cg.freezes != 1 {
					t.Errorf("froze %d times; the growth must be stopped once before the kill", r.cg.freezes)
				}
			}
			if r.cg.frozen {
				t.Error("the workspace was left frozen")
			}
		})
	}
}

func TestStateSurvivesRestart(t *testing.T) {
	cfg := testConfig()
	cfg.MemoryLimit = 0 // taken from the cgroup at the first start
	r := newRig(t, cfg)
	if r.g.memLimit() != 1024*mib {
		t.Fatalf("M = %d; want the cgroup's limit", r.g.memLimit())
	}
	// Three kills trigger the kill-loop pause.
	for i := 0; i < 3; i++ {
		r.procs.procs[100+i] = victim.Process{Identity: victim.Identity{PID: 100 + i, StartTime: uint64(400 + i), Exe: "/x"}, RSS: 900 * mib}
		r.cg.usage = 1000 * mib
		r.g.checkMemory(context.Background())
		r.clock.t = r.clock.t.Add(time.Second)
	}
	if !r.has("memory-kill-loop") {
		t.Fatalf("no kill-loop alert after 3 kills: %v", r.alertKinds())
	}

	// A second guardian on the same state: the lowered limit must not
	// become the new M, and the pause and the alerts carry over.
	g2, err := New(cfg, Deps{Workspace: &fakeWorkspace{cg: r.cg}, Procs: r.procs, Killer: r.killer, Scheduler: r.sched, Prober: fakeProber{},
		Alerts: alert.New(alert.Config{}, r.clock.now, nil, nil), Metrics: NewMetrics(prometheus.NewRegistry()),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), State: r.store, Now: r.clock.now})
	if err != nil {
		t.Fatal(err)
	}
	if err := g2.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := g2.Attach(context.Background(), r.cg); err != nil {
		t.Fatal(err)
	}
	if g2.memLimit() != 1024*mib {
		t.Errorf("restarted M = %d; want 1024 MiB remembered (the cgroup now says %d)", g2.memLimit(), r.cg.limit)
	}
	if g2.st.Starts != 2 {
		t.Errorf("starts = %d; want 2", g2.st.Starts)
	}
	var kinds []string
	for _, a := range g2.Alerts() {
		kinds = append(kinds, a.Kind)
	}
	if !slices.Contains(kinds, "memory-kill-loop") {
		t.Errorf("alerts after restart = %v; the earlier ones must be kept", kinds)
	}
	r.procs.procs[200] = victim.Process{Identity: victim.Identity{PID: 200, StartTime: 500, Exe: "/x"}, RSS: 900 * mib}
	r.cg.usage = 1000 * mib
	r.killer.calls = nil
	g2.checkMemory(context.Background())
	if len(r.killer.calls) != 0 {
		t.Errorf("the restarted guardian killed during the kill-loop pause: %v", r.killer.calls)
	}
}

func TestStartSurvivesLimitsThatCannotBeApplied(t *testing.T) {
	clk := &clock{time.Unix(1_000_000, 0)}
	table := &fakeProcs{oom: map[int]int{}, procs: map[int]victim.Process{}}
	cg := &fakeCgroup{table: table, limit: 1024 * mib, setMemErr: unix.EBUSY}
	table.cgroup = cg
	alerts := alert.New(alert.Config{}, clk.now, nil, nil)
	g, err := New(testConfig(), Deps{Workspace: &fakeWorkspace{cg: cg}, Procs: table, Killer: &fakeKiller{table: table}, Scheduler: &fakeSched{attrs: map[int]sched.Attr{}},
		Prober: fakeProber{}, Alerts: alerts, Metrics: NewMetrics(prometheus.NewRegistry()), Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := g.Attach(context.Background(), cg); err != nil {
		t.Fatalf("Attach() = %v; a limit that cannot be set yet must not stop guardian", err)
	}
	if !g.limitsPending {
		t.Error("limits not marked for retry")
	}
	cg.setMemErr = nil
	g.protect(context.Background())
	if g.limitsPending || len(cg.setMemory) != 1 {
		t.Errorf("the protector did not retry the limits: pending %v, calls %v", g.limitsPending, cg.setMemory)
	}
}

func TestProtect(t *testing.T) {
	t.Run("RT refused: nice fallback and an alert", func(t *testing.T) {
		cfg := testConfig()
		r := newRigWith(t, cfg, func(r *rig) { r.sched.rrErr = unix.EPERM })
		if a := r.sched.attrs[20]; a.Nice != -20 || a.Policy == unix.SCHED_RR {
			t.Errorf("listener = %+v; want nice -20", a)
		}
		if !r.has("sshd-rt-refused") {
			t.Errorf("alerts = %v; want sshd-rt-refused", r.alertKinds())
		}
	})
	t.Run("no RT budget: nice fallback and an alert", func(t *testing.T) {
		r := newRigWith(t, testConfig(), func(r *rig) { r.cg.rtErr = unix.EINVAL })
		if a := r.sched.attrs[20]; a.Nice != -20 {
			t.Errorf("listener = %+v; want nice -20", a)
		}
		if !r.has("sshd-rt-unavailable") {
			t.Errorf("alerts = %v", r.alertKinds())
		}
	})
	t.Run("re-applied when the user changed it", func(t *testing.T) {
		r := newRig(t, testConfig())
		r.sched.attrs[20] = sched.Attr{Policy: unix.SCHED_IDLE}
		r.procs.oom[20] = 0
		r.g.protect(context.Background())
		if !r.sched.attrs[20].IsRR(1) || r.procs.oom[20] != -1000 {
			t.Errorf("listener not re-protected: %+v oom %d", r.sched.attrs[20], r.procs.oom[20])
		}
	})
	t.Run("an unprotected child that inherited -1000 gets 0 back", func(t *testing.T) {
		r := newRig(t, testConfig())
		r.procs.oom[41] = -1000
		r.procs.oom[40] = -997 // kubelet's Guaranteed-QoS score: left alone
		r.g.protect(context.Background())
		if r.procs.oom[41] != 0 || r.procs.oom[40] != -997 {
			t.Errorf("oom_score_adj 41=%d 40=%d; want 0 and -997", r.procs.oom[41], r.procs.oom[40])
		}
	})
	t.Run("without CAP_SYS_RESOURCE an alert says so", func(t *testing.T) {
		r := newRigWith(t, testConfig(), func(r *rig) { r.procs.oomErr = os.ErrPermission })
		if !r.has("oom-protection-unavailable") {
			t.Errorf("alerts = %v", r.alertKinds())
		}
	})
	t.Run("a stopped listener is continued, a stopped user process is not", func(t *testing.T) {
		r := newRig(t, testConfig())
		for _, pid := range []int{20, 41} {
			p := r.procs.procs[pid]
			p.State = "T"
			r.procs.procs[pid] = p
		}
		r.killer.calls = nil
		r.g.protect(context.Background())
		if diff := cmp.Diff([]signal{{20, unix.SIGCONT, -1}}, r.killer.calls); diff != "" {
			t.Errorf("signals (-want +got):\n%s", diff)
		}
		if !r.has("protected-stopped") {
			t.Errorf("alerts = %v", r.alertKinds())
		}
	})
	t.Run("the listener a containment stopped while it holds forks is left to it", func(t *testing.T) {
		r := newRig(t, testConfig())
		p := r.procs.procs[20]
		p.State = "T"
		r.procs.procs[20] = p
		r.g.mu.Lock()
		r.g.heldListener = p.Identity
		r.g.mu.Unlock()
		r.killer.calls = nil
		r.g.protect(context.Background())
		if len(r.killer.calls) != 0 {
			t.Errorf("signals = %v; want none", r.killer.calls)
		}
		if r.has("protected-stopped") {
			t.Errorf("alerts = %v; want no protected-stopped", r.alertKinds())
		}
	})
	t.Run("sshd gone", func(t *testing.T) {
		r := newRig(t, testConfig())
		delete(r.procs.procs, 20)
		r.g.protect(context.Background())
		if !r.has("sshd-gone") {
			t.Errorf("alerts = %v; want sshd-gone", r.alertKinds())
		}
	})
}

func TestCleanup(t *testing.T) {
	r := newRig(t, testConfig())
	res, err := r.g.Cleanup(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(res.Killed)
	// init, listener and the live connection's sshd stay; the shell and the
	// jobs (one of them renamed "sshd") go.
	if diff := cmp.Diff([]int{31, 40, 41}, res.Killed); diff != "" {
		t.Errorf("killed (-want +got):\n%s", diff)
	}
	if r.cg.frozen {
		t.Error("left frozen")
	}
	r.g.emergency.Lock()
	defer r.g.emergency.Unlock()
	if _, err := r.g.Cleanup(context.Background()); !errors.Is(err, ErrBusy) {
		t.Errorf("Cleanup during another emergency = %v; want ErrBusy", err)
	}
}

// A containment holds every fork (pids.max 0) from before its first
// freeze until just before its first thaw, so the round's kills cannot be
// replaced and sshd, thawed, can fork again.
// A containment whose first freeze completes in time never touches
// pids.max (sshd keeps forking for logins until it is frozen too); one
// whose freeze drags on past HoldForksAfter holds every fork from then
// until just before the first thaw, with the sshd listener (PID 20)
// stopped for exactly as long, so it accepts no connection it could not
// fork for; a workspace within PidsReserve of pids.max gets the reserve
// at the first thaw either way.
func TestContainmentHoldsForksOnlyWhileTheFirstFreezeDragsOn(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stuck   bool
		reserve int // PidsReserve; the workspace is within it of pids.max when it is as large
		want    []string
	}{
		{"the freeze completes: no hold", false, 64, []string{"freeze", "kill", "thaw", "freeze", "thaw"}},
		{"the freeze drags on: forks held from then until the first thaw", true, 64,
			[]string{"freeze", "stopped (signal) 20", "pids.max 0", "freeze", "kill", "pids.max 4096", "continued 20", "thaw", "freeze", "thaw"}},
		{"found within the reserve of the limit: the reserve is given at the first thaw", false, 4096,
			[]string{"freeze", "kill", "pids.max 8192", "thaw", "freeze", "thaw"}},
		{"held and within the reserve: released with the reserve", true, 4096,
			[]string{"freeze", "stopped (signal) 20", "pids.max 0", "freeze", "kill", "pids.max 8192", "continued 20", "thaw", "freeze", "thaw"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.FreezeTimeout, cfg.HoldForksAfter, cfg.PidsReserve = 200*time.Millisecond, 20*time.Millisecond, tc.reserve
			r := newRig(t, cfg)
			r.cg.mu.Lock()
			r.cg.log, r.cg.freezeStuck = nil, tc.stuck
			r.cg.mu.Unlock()
			if _, err := r.g.Cleanup(context.Background()); err != nil {
				t.Fatal(err)
			}
			r.cg.mu.Lock()
			got := slices.Compact(slices.Clone(r.cg.log))
			r.cg.mu.Unlock()
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("pids.max, freezes and kills in order (-want +got):\n%s", diff)
			}
		})
	}
}

// A process a CPU storm demoted to SCHED_IDLE gets normal scheduling back
// before guardian kills it, so it can run to exit, and the storm leaves it
// there while it dies; any other scheduling is left as it is.
func TestAKilledProcessMayRunToExit(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy int // the victim's before the kill
		kill   func(*rig)
		victim int
		want   int
	}{
		{"memory kill of a demoted process", unix.SCHED_IDLE, func(r *rig) {
			r.cg.usage = 1000 * mib
			r.g.checkMemory(context.Background())
		}, 40, unix.SCHED_NORMAL},
		{"containment of a demoted process", unix.SCHED_IDLE, func(r *rig) {
			if _, err := r.g.Cleanup(context.Background()); err != nil {
				t.Fatal(err)
			}
		}, 41, unix.SCHED_NORMAL},
		{"a batch process keeps its scheduling", unix.SCHED_BATCH, func(r *rig) {
			r.cg.usage = 1000 * mib
			r.g.checkMemory(context.Background())
		}, 40, unix.SCHED_BATCH},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, testConfig())
			r.sched.attrs[tc.victim] = sched.Attr{Policy: tc.policy}
			victim := r.procs.procs[tc.victim]
			tc.kill(r)
			r.killer.mu.Lock()
			got, signalled := r.killer.policy[tc.victim]
			r.killer.mu.Unlock()
			if !signalled {
				t.Fatalf("pid %d was not killed", tc.victim)
			}
			if got != tc.want {
				t.Errorf("scheduling policy at the kill = %d; want %d", got, tc.want)
			}
			if !r.g.stillDying()[victim.Key()] {
				t.Errorf("pid %d is not marked dying: the storm would demote it again", tc.victim)
			}
		})
	}
}

// guardian gives its own container OwnCPUWeight at every watch, whatever
// wrote another meanwhile; 0 leaves the runtime's, outside a Pod there is
// nothing to set, and a refusal is alerted once until it succeeds.
func TestOwnCPUWeight(t *testing.T) {
	refused := errors.New("permission denied")
	type step struct {
		runtimeWrites int   // the runtime writes this weight before the watch; 0: nothing
		refuse        error // SetCPUWeight refused during this watch
	}
	for _, tt := range []struct {
		name       string
		weight     int
		notInAPod  bool
		steps      []step
		want       int
		wantAlerts int
	}{
		{"raised from the runtime's", 10000, false, []step{{}}, 10000, 0},
		{"written again after the runtime wrote its own", 10000, false, []step{{}, {runtimeWrites: 4}}, 10000, 0},
		{"another weight configured", 500, false, []step{{}}, 500, 0},
		{"0 leaves the runtime's", 0, false, []step{{}}, 4, 0},
		{"nothing to set outside a Pod", 10000, true, []step{{}}, 4, 0},
		{"refused: alerted once, set once allowed", 10000, false, []step{{refuse: refused}, {refuse: refused}, {}}, 10000, 1},
		{"refused again after a success: alerted again", 10000, false, []step{{refuse: refused}, {}, {runtimeWrites: 4, refuse: refused}}, 4, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.OwnCPUWeight = tt.weight
			own := &fakeCgroup{cpuWeight: 4, name: "guardian"}
			r := newRigWith(t, cfg, func(r *rig) {
				if !tt.notInAPod {
					r.ws.own = own
				}
			})
			var alerts int
			for _, s := range tt.steps {
				if s.runtimeWrites != 0 {
					own.cpuWeight = s.runtimeWrites
				}
				own.weightErr = s.refuse
				r.g.keepOwnWeight()
				r.clock.t = r.clock.t.Add(2 * time.Second) // past the aggregation window: each alert stands apart
			}
			for _, a := range r.alerts.Recent() {
				if a.Kind == "own-cpu-weight-refused" {
					alerts += a.Count
				}
			}
			if diff := cmp.Diff(tt.want, own.cpuWeight); diff != "" {
				t.Errorf("guardian's own CPU weight (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantAlerts, alerts); diff != "" {
				t.Errorf("own-cpu-weight-refused alerts (-want +got):\n%s", diff)
			}
		})
	}
}
