package cgroupfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"labkeep/guardian/internal/poll"
	"labkeep/guardian/internal/testcgroup"
)

func TestV1PidsCurrentReal(t *testing.T) {
	rel := testcgroup.NewV1(t, testcgroup.Limits{MemoryBytes: 64 << 20, Pids: 16})
	c := openV1(t, rel)
	cmd := testcgroup.Command(rel, "/bin/sh", "-c", "sleep 30 & sleep 30 & wait")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitProcs(t, c, 3)
	if n, err := c.PidsCurrent(); err != nil || n != 3 {
		t.Errorf("PidsCurrent() = %d, %v; want 3 (the shell and two sleeps)", n, err)
	}
}

// cgroup v1 counts refused forks in pids.events but the kernel sends the
// notification to pids.events.local, which v1 lacks: nothing wakes a
// watcher, so V1.WatchPids says it is unsupported and guardian polls. Should
// a kernel start notifying, this test says so.
func TestV1PidsEventsNotNotifiedReal(t *testing.T) {
	rel := testcgroup.NewV1(t, testcgroup.Limits{MemoryBytes: 64 << 20, Pids: 4})
	c := openV1(t, rel)
	if _, err := c.WatchPids(context.Background()); !errors.Is(err, ErrUnsupported) {
		t.Errorf("V1.WatchPids() error = %v; want ErrUnsupported", err)
	}
	in, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(in)
	if _, err := unix.InotifyAddWatch(in, filepath.Join(c.Dir("pids"), "pids.events"), unix.IN_MODIFY); err != nil {
		t.Fatal(err)
	}
	before, _ := c.PidsRefused()
	cmd := testcgroup.Command(rel, "/bin/sh", "-c", "for i in 1 2 3 4 5 6 7 8; do sleep 30 & done; wait")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	poll.Eventually(t, 5*time.Second, func() (bool, string) {
		n, _ := c.PidsRefused()
		return n != before, fmt.Sprintf("no fork refused at pids.max 4 (pids.events max stays %d)", n)
	})
	pfd := []unix.PollFd{{Fd: int32(in), Events: unix.POLLIN}}
	n, err := unix.Poll(pfd, 300)
	for errors.Is(err, unix.EINTR) {
		n, err = unix.Poll(pfd, 300)
	}
	if n > 0 {
		t.Errorf("the kernel notified pids.events on cgroup v1: V1.WatchPids can use it instead of returning ErrUnsupported")
	}
}

// The kernel rewrites pids.events when it refuses a fork; inotify sees the
// same modification on the fixture.
func TestV2WatchPidsFixture(t *testing.T) {
	_, c := v2Fixture(t)
	mkfile(t, filepath.Join(c.Dir(), "pids.events"), "max 0\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := c.WatchPids(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mkfile(t, filepath.Join(c.Dir(), "pids.events"), "max 7\n")
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("no notification after pids.events changed")
	}
	if n, err := c.PidsRefused(); err != nil || n != 7 {
		t.Errorf("PidsRefused() = %d, %v; want 7", n, err)
	}
	cancel()
	for range ch {
	}
}

// On a cgroup2 mount with the pids controller a refused fork wakes
// WatchPids at once.
func TestV2WatchPidsReal(t *testing.T) {
	dir := testcgroup.NewV2(t)
	parent, _ := os.ReadFile(filepath.Join(filepath.Dir(dir), "cgroup.subtree_control"))
	if !slices.Contains(strings.Fields(string(parent)), "pids") {
		t.Skipf("the pids controller is not enabled on the cgroup2 mount %s (this host runs it on v1)", testcgroup.V2Root)
	}
	rel := strings.TrimPrefix(dir, testcgroup.V2Root)
	c, err := OpenV2(testcgroup.V2Root, rel, rel)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetPidsMax(4); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := c.WatchPids(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cmd := testcgroup.CommandV2(dir, "/bin/sh", "-c", "for i in 1 2 3 4 5 6 7 8; do sleep 30 & done; wait")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("no notification when forks were refused at pids.max")
	}
	if n, err := c.PidsRefused(); err != nil || n == 0 {
		t.Errorf("PidsRefused() = %d, %v after the notification; want > 0", n, err)
	}
	if n, err := c.PidsCurrent(); err != nil || n != 4 {
		t.Errorf("PidsCurrent() = %d, %v; want 4 (at pids.max)", n, err)
	}
}

// The kernel notifies pids.events at every refused fork and memory.events
// at every throttled allocation: a storm of them reaches the watch
// channel at most once per NotifyGap, and nothing is lost: a change after
// the storm still signals.
func TestWatchPacesAStorm(t *testing.T) {
	_, c := v2Fixture(t)
	f := filepath.Join(c.Dir(), "pids.events")
	mkfile(t, f, "max 0\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := c.WatchPids(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var signals atomic.Int64
	go func() {
		for range ch {
			signals.Add(1)
		}
	}()
	writes, start := 0, time.Now()
	for time.Since(start) < 500*time.Millisecond {
		writes++
		mkfile(t, f, fmt.Sprintf("max %d\n", writes))
	}
	storm := time.Since(start)
	time.Sleep(3 * NotifyGap) // the storm's last signal
	most := int64(storm/NotifyGap) + 2
	if n := signals.Load(); n < 1 || n > most {
		t.Errorf("%d signals for %d notifications in %v; want 1 to %d", n, writes, storm.Round(time.Millisecond), most)
	}
	if int64(writes) < 5*most {
		t.Fatalf("only %d notifications in %v: no storm to pace", writes, storm.Round(time.Millisecond))
	}
	after := signals.Load()
	mkfile(t, f, "max 0\n")
	if !poll.Until(5*time.Second, func() bool { return signals.Load() > after }) {
		t.Errorf("a change after the storm was not signalled")
	}
}
