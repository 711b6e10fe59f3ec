package guestvm_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"labkeep/localrun/guestvm"
)

// The guest runs a host program on a cgroup v2-only kernel with the
// controllers guardian needs enabled for children, and the host sees its
// output and exit code.
func TestGuestRunsOnCgroupV2(t *testing.T) {
	kernel := guestvm.RequireKernel(t)
	// The build and the boot have bounds of their own: from empty caches
	// and beside other suites, building guestinit (a static standard
	// library) alone has taken over three minutes here, and only the boot
	// is under test.
	buildCtx, cancelBuild := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancelBuild()
	init, err := guestvm.BuildInit(buildCtx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out strings.Builder
	start := time.Now()
	code, err := guestvm.Run(ctx, guestvm.Spec{
		Kernel: kernel, Init: init,
		Programs: []string{"/bin/sh", "/usr/bin/cat", "/usr/bin/ls", "/usr/bin/mkdir"},
		Command:  []string{"/bin/sh", "-c", `cat /sys/fs/cgroup/cgroup.subtree_control; mkdir /sys/fs/cgroup/child && ls /sys/fs/cgroup/child; cat /proc/self/cgroup; exit 7`},
		Output:   &out,
	})
	if err != nil {
		t.Fatalf("%v\nconsole:\n%s", err, out.String())
	}
	t.Logf("guest booted, ran and powered off in %v", time.Since(start).Round(time.Millisecond))
	if code != 7 {
		t.Errorf("exit code = %d; want 7\nconsole:\n%s", code, out.String())
	}
	for _, want := range []string{"memory", "pids", "cpu", "memory.pressure", "cgroup.kill", "cgroup.freeze", "0::/"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("console lacks %q:\n%s", want, out.String())
		}
	}
}
