package guard

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"labkeep/guardian/alert"
	"labkeep/guardian/internal/poll"
	"labkeep/guardian/procfs"
	"labkeep/guardian/sched"
)

// On the real kernel: guardian gives a process SCHED_RR as it gives the
// listener, the process spins, and the policing loop (real procfs CPU
// times, real sched_setattr) takes it back to SCHED_OTHER within a few
// windows, with an alert, and the protector does not raise it again.
func TestRTPoliceDemotesASpinnerOnTheRealKernel(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_SYS_NICE) to set SCHED_RR")
	}
	spin := exec.Command("/bin/sh", "-c", "while :; do :; done")
	if err := spin.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { spin.Process.Kill(); spin.Wait() })
	fs := procfs.New("/proc", "")
	clk := time.Now
	alerts := alert.New(alert.Config{Window: time.Second}, clk, nil, nil)
	cfg := testConfig()
	cfg.RTPoliceEvery = 200 * time.Millisecond
	cfg.RTPoliceFor = 3 * cfg.RTPoliceEvery
	g, err := New(cfg, Deps{Workspace: &fakeWorkspace{}, Procs: fs, Scheduler: sched.OS{}, Prober: fakeProber{},
		Alerts: alerts, Metrics: NewMetrics(prometheus.NewRegistry()), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	p, err := fs.Process(spin.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	g.protectScheduling(p.Identity, false)
	if a, err := sched.Get(p.PID); err != nil || !a.IsRR(1) {
		t.Fatalf("spinner = %+v, %v; want SCHED_RR 1 from the protector", a, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); g.rtPoliceLoop(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	granted := time.Now()
	var a sched.Attr
	poll.Until(5*time.Second, func() bool {
		a, err = sched.Get(p.PID)
		return err == nil && a.Policy == unix.SCHED_NORMAL
	})
	if a.Policy != unix.SCHED_NORMAL || a.Nice != 0 {
		t.Fatalf("spinner = %+v 5s after SCHED_RR; want demoted to SCHED_OTHER nice 0", a)
	}
	t.Logf("spinner demoted %v after it got SCHED_RR (window %v)", time.Since(granted).Round(10*time.Millisecond), cfg.RTPoliceEvery)
	var found bool
	for _, al := range alerts.Recent() {
		found = found || al.Kind == "rt-demoted"
	}
	if !found {
		t.Errorf("alerts = %+v; want rt-demoted", alerts.Recent())
	}
	g.protectScheduling(p.Identity, false)
	if a, _ := sched.Get(p.PID); a.Policy != unix.SCHED_NORMAL {
		t.Errorf("after the protector ran again the spinner = %+v; a demoted process must not get SCHED_RR back", a)
	}
}
