package cgroupfs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeProc lays out /proc/PID/{environ,exe} for discovery.
func fakeProc(t *testing.T, root string, pid string, exe string, env ...string) {
	t.Helper()
	dir := filepath.Join(root, pid)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "environ"), []byte(strings.Join(env, "\x00")+"\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, "exe"))
	if err := os.Symlink(exe, filepath.Join(dir, "exe")); err != nil {
		t.Fatal(err)
	}
}

func TestOpenV1RequiresEveryController(t *testing.T) {
	mount := t.TempDir()
	for _, ctrl := range []string{"memory", "pids", "freezer", "cpu"} { // no cpuacct
		if err := os.MkdirAll(filepath.Join(mount, ctrl, "ws"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mounts := map[string]string{}
	for _, ctrl := range []string{"memory", "pids", "freezer", "cpu"} {
		mounts[ctrl] = filepath.Join(mount, ctrl)
	}
	_, err := Open(Layout{V1: mounts}, "", "/ws")
	if err == nil || !strings.Contains(err.Error(), "cpuacct") {
		t.Errorf("Open without cpuacct = %v; want an error naming it", err)
	}
}
