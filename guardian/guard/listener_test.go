package guard

import (
	"context"
	"hash/fnv"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"labkeep/guardian/sched"
	"labkeep/guardian/victim"
)

// replacedFiles holds, per fake process table, the processes whose
// executable is another file than the one their path names (a binary
// replaced under a running process).
var replacedFiles sync.Map // *fakeProcs → map[int]victim.FileID

// fileOf is the fakes' file identity of a path: one file per path.
func fileOf(path string) victim.FileID {
	h := fnv.New64a()
	h.Write([]byte(path))
	return victim.FileID{Dev: 1, Ino: h.Sum64() | 1}
}

func (f *fakeProcs) ExeFile(pid int) (victim.FileID, error) {
	if m, ok := replacedFiles.Load(f); ok {
		if id, ok := m.(map[int]victim.FileID)[pid]; ok {
			return id, nil
		}
	}
	p, err := f.Process(pid)
	if err != nil {
		return victim.FileID{}, err
	}
	return fileOf(p.Exe), nil
}

func (f *fakeProcs) FileInRoot(_ int, path string) (victim.FileID, error) { return fileOf(path), nil }

func (s *fakeSched) SetOther(pid, nice int) error {
	s.attrs[pid] = sched.Attr{Policy: unix.SCHED_NORMAL, ResetOnFork: true, Nice: nice}
	return nil
}

// replaceExe makes pid run another file than its path names from now on.
func (r *rig) replaceExe(t *testing.T, pid int) {
	t.Helper()
	replacedFiles.Store(r.procs, map[int]victim.FileID{pid: {Dev: 1, Ino: 42}})
	t.Cleanup(func() { replacedFiles.Delete(r.procs) })
}

// setProc puts p into the fake process table.
func (r *rig) setProc(p victim.Process) {
	r.procs.mu.Lock()
	defer r.procs.mu.Unlock()
	r.procs.procs[p.PID] = p
}

// protected returns the PIDs the protected set holds for reason.
func (r *rig) protected(t *testing.T, reason victim.Reason) []int {
	t.Helper()
	_, prot, err := r.g.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for k, why := range prot {
		if why == reason {
			out = append(out, k.PID)
		}
	}
	slices.Sort(out)
	return out
}

func TestListenerIdentity(t *testing.T) {
	t.Run("another program that takes over the port gets nothing and can be killed", func(t *testing.T) {
		r := newRig(t, testConfig())
		// The user kills sshd (20) and its connection, and binds the port.
		r.procs.mu.Lock()
		delete(r.procs.procs, 20)
		delete(r.procs.procs, 30)
		r.procs.listener = 50
		r.procs.mu.Unlock()
		r.setProc(victim.Process{Identity: victim.Identity{PID: 50, StartTime: 500, Exe: "/tmp/fakesshd"}, PPID: 31, RSS: 1 * mib})
		r.procs.oom[50] = -1000 // whatever it inherited
		r.g.protect(context.Background())
		if a := r.sched.attrs[50]; a.Policy == unix.SCHED_RR || a.Nice < 0 {
			t.Errorf("impostor scheduling = %+v; want none raised", a)
		}
		if r.procs.oom[50] != 0 {
			t.Errorf("impostor oom_score_adj = %d; want 0", r.procs.oom[50])
		}
		if !r.has("listener-not-sshd") {
			t.Errorf("alerts = %v; want listener-not-sshd", r.alertKinds())
		}
		if got := r.protected(t, victim.ReasonListener); len(got) != 0 {
			t.Errorf("protected listeners = %v; want none", got)
		}
		if _, err := r.g.Cleanup(context.Background()); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(r.killed(), 50) {
			t.Errorf("cleanup killed %v; want the impostor 50 among them", r.killed())
		}
	})
	t.Run("the sshd listener re-executing a replaced binary loses real-time and protection", func(t *testing.T) {
		r := newRig(t, testConfig())
		if !r.sched.attrs[20].IsRR(1) {
			t.Fatalf("listener = %+v; want SCHED_RR before the replacement", r.sched.attrs[20])
		}
		r.replaceExe(t, 20) // same PID, start time and path; another file
		r.g.protect(context.Background())
		if a := r.sched.attrs[20]; a.Policy != unix.SCHED_NORMAL || a.Nice != 0 {
			t.Errorf("scheduling = %+v; want demoted to SCHED_OTHER nice 0", a)
		}
		if r.procs.oom[20] != 0 {
			t.Errorf("oom_score_adj = %d; want 0", r.procs.oom[20])
		}
		if got := r.protected(t, victim.ReasonListener); len(got) != 0 {
			t.Errorf("protected listeners = %v; want none", got)
		}
		if got := r.protected(t, victim.ReasonSession); len(got) != 0 {
			t.Errorf("protected sessions = %v; want none without a verified listener", got)
		}
		if !r.has("listener-not-sshd") {
			t.Errorf("alerts = %v; want listener-not-sshd", r.alertKinds())
		}
	})
	t.Run("a connection that runs a replaced sshd binary is not protected", func(t *testing.T) {
		r := newRig(t, testConfig())
		if got := r.protected(t, victim.ReasonSession); !slices.Equal(got, []int{30}) {
			t.Fatalf("protected sessions = %v; want [30] before the replacement", got)
		}
		r.replaceExe(t, 30) // sshd re-executed a replaced /usr/sbin/sshd for this connection
		if got := r.protected(t, victim.ReasonSession); len(got) != 0 {
			t.Errorf("protected sessions = %v; want none", got)
		}
		if !r.has("session-not-sshd") {
			t.Errorf("alerts = %v; want session-not-sshd", r.alertKinds())
		}
		if got := r.protected(t, victim.ReasonListener); !slices.Equal(got, []int{20}) {
			t.Errorf("protected listeners = %v; want the verified listener [20] kept", got)
		}
	})
	t.Run("a configured sshd executable the listener does not run protects nothing", func(t *testing.T) {
		cfg := testConfig()
		cfg.SSHDExe = "/usr/sbin/sshd.real"
		r := newRig(t, cfg)
		if a := r.sched.attrs[20]; a.Policy == unix.SCHED_RR || r.procs.oom[20] == -1000 {
			t.Errorf("listener = %+v oom %d; want nothing raised", a, r.procs.oom[20])
		}
		if !r.has("listener-not-sshd") {
			t.Errorf("alerts = %v; want listener-not-sshd", r.alertKinds())
		}
	})
	t.Run("the configured sshd executable is protected", func(t *testing.T) {
		cfg := testConfig()
		cfg.SSHDExe = "/usr/sbin/sshd"
		r := newRig(t, cfg)
		if !r.sched.attrs[20].IsRR(1) || r.procs.oom[20] != -1000 {
			t.Errorf("listener = %+v oom %d; want SCHED_RR and -1000", r.sched.attrs[20], r.procs.oom[20])
		}
		if got := r.protected(t, victim.ReasonSession); !slices.Equal(got, []int{30}) {
			t.Errorf("protected sessions = %v; want [30]", got)
		}
	})
	t.Run("a new workspace cgroup learns its sshd afresh", func(t *testing.T) {
		r := newRig(t, testConfig())
		r.replaceExe(t, 20) // the new container's sshd is another file
		if err := r.g.Attach(context.Background(), r.cg); err != nil {
			t.Fatal(err)
		}
		if got := r.protected(t, victim.ReasonListener); !slices.Equal(got, []int{20}) {
			t.Errorf("protected listeners = %v; want [20]", got)
		}
		if r.has("listener-not-sshd") {
			t.Errorf("alerts = %v; want no listener-not-sshd", r.alertKinds())
		}
	})
}

func TestNiceFallbackResetsOnFork(t *testing.T) {
	cfg := testConfig()
	cfg.RTPriority = 0 // real-time disabled
	r := newRig(t, cfg)
	want := sched.Attr{Policy: unix.SCHED_NORMAL, ResetOnFork: true, Nice: -20}
	if a := r.sched.attrs[20]; a != want {
		t.Errorf("listener = %+v; want %+v", a, want)
	}
}

func TestRTPolice(t *testing.T) {
	spend := func(r *rig, pid int, ticks uint64) {
		r.procs.mu.Lock()
		p := r.procs.procs[pid]
		p.CPUTicks += ticks
		r.procs.procs[pid] = p
		r.procs.mu.Unlock()
	}
	t.Run("a listener within its share keeps real-time", func(t *testing.T) {
		r := newRig(t, testConfig())
		for i := 0; i < 3; i++ {
			r.g.policeRT(context.Background())
			r.clock.t = r.clock.t.Add(time.Second)
			spend(r, 20, 3) // 3 % of a CPU
		}
		r.g.policeRT(context.Background())
		if !r.sched.attrs[20].IsRR(1) || r.has("rt-demoted") {
			t.Errorf("listener = %+v, alerts %v; want SCHED_RR kept", r.sched.attrs[20], r.alertKinds())
		}
	})
	t.Run("a burst over its share shorter than RTPoliceFor keeps real-time", func(t *testing.T) {
		r := newRig(t, testConfig())
		// Over for two of the three seconds RTPoliceFor allows, within
		// for one, then over for two again: never three in a row.
		for _, ticks := range []uint64{60, 60, 1, 60, 60} {
			r.g.policeRT(context.Background())
			r.clock.t = r.clock.t.Add(time.Second)
			spend(r, 20, ticks)
		}
		r.g.policeRT(context.Background())
		if !r.sched.attrs[20].IsRR(1) || r.has("rt-demoted") {
			t.Errorf("listener = %+v, alerts %v; want SCHED_RR kept", r.sched.attrs[20], r.alertKinds())
		}
	})
	t.Run("a listener over its share for RTPoliceFor is demoted for good, a new listener is raised again", func(t *testing.T) {
		r := newRig(t, testConfig())
		for i := 0; i < 3; i++ {
			r.g.policeRT(context.Background())
			if r.has("rt-demoted") {
				t.Fatalf("demoted after %d s over its share; RTPoliceFor is %v", i, testConfig().RTPoliceFor)
			}
			r.clock.t = r.clock.t.Add(time.Second)
			spend(r, 20, 60) // 60 % of a CPU
		}
		r.g.policeRT(context.Background())
		want := sched.Attr{Policy: unix.SCHED_NORMAL, ResetOnFork: true}
		if a := r.sched.attrs[20]; a != want {
			t.Errorf("listener = %+v; want %+v", a, want)
		}
		if !r.has("rt-demoted") {
			t.Errorf("alerts = %v; want rt-demoted", r.alertKinds())
		}
		r.g.protect(context.Background())
		if a := r.sched.attrs[20]; a != want {
			t.Errorf("after the protector listener = %+v; want still %+v", a, want)
		}
		if got := r.protected(t, victim.ReasonListener); !slices.Equal(got, []int{20}) {
			t.Errorf("protected listeners = %v; the demoted sshd stays protected from kills", got)
		}
		// sshd restarts: a new listener process running the same file.
		r.procs.mu.Lock()
		delete(r.procs.procs, 20)
		r.procs.listener = 21
		r.procs.mu.Unlock()
		r.setProc(victim.Process{Identity: victim.Identity{PID: 21, StartTime: 600, Exe: "/usr/sbin/sshd"}, PPID: 7})
		r.g.protect(context.Background())
		if !r.sched.attrs[21].IsRR(1) {
			t.Errorf("new listener = %+v; want SCHED_RR", r.sched.attrs[21])
		}
	})
	t.Run("an exited process is forgotten", func(t *testing.T) {
		r := newRig(t, testConfig())
		r.procs.mu.Lock()
		delete(r.procs.procs, 20)
		r.procs.mu.Unlock()
		r.g.policeRT(context.Background())
		r.g.mu.Lock()
		n := len(r.g.sshd.raised)
		r.g.mu.Unlock()
		if n != 0 {
			t.Errorf("%d processes still tracked after the listener exited", n)
		}
	})
}
