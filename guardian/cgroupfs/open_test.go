package cgroupfs

import (
	"errors"
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
	if err := os.Symlink(exe, filepath.Join(dir, "exe")); err != nil {
		t.Fatal(err)
	}
}

func TestDiscoverAndOpenV2(t *testing.T) {
	const uid = "0f3c2a51-6b7e-4c1d-9a8b-1234567890ab"
	mount := t.TempDir()
	proc := t.TempDir()
	pod := "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice"
	containers := map[string]string{
		"cri-containerd-pause.scope":    "1\n",
		"cri-containerd-guardian.scope": "10\n",
		"cri-containerd-ws.scope":       "20\n21\n",
		"cri-containerd-other.scope":    "30\n",
	}
	for c, procs := range containers {
		mkfile(t, filepath.Join(mount, pod, c, "cgroup.procs"), procs)
		for _, knob := range []string{"memory.max", "memory.high", "pids.max"} {
			mkfile(t, filepath.Join(mount, pod, c, knob), "max\n")
		}
	}
	fakeProc(t, proc, "1", "/pause")
	fakeProc(t, proc, "10", "/ko-app/guardian", "CONTAINER_NAME=workspace")
	fakeProc(t, proc, "20", "/usr/sbin/sshd", "LABKEEP_CONTAINER_NAME=workspace", "PATH=/bin")
	fakeProc(t, proc, "21", "/usr/bin/bash")
	fakeProc(t, proc, "30", "/usr/bin/sidecar", "LABKEEP_CONTAINER_NAME=workspace-helper")

	layout := Layout{V2: mount}
	own := "/" + pod + "/cri-containerd-guardian.scope"
	cg, subtree, err := Discover(layout, proc, uid, "workspace", own)
	if err != nil {
		t.Fatal(err)
	}
	if want := "/" + pod + "/cri-containerd-ws.scope"; cg != want || subtree != "/"+pod {
		t.Fatalf("Discover() = %q, %q; want %q in /%s", cg, subtree, want, pod)
	}
	if _, _, err := Discover(layout, proc, uid, "nosuch", own); !errors.Is(err, ErrNotFound) {
		t.Errorf("Discover(unknown container) error = %v; want ErrNotFound (two non-pause candidates)", err)
	}

	c, err := Open(layout, subtree, cg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetPidsMax(4096); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(mount, cg, "pids.max")); got != "4096" {
		t.Errorf("pids.max = %s", got)
	}
	// An absolute directory under the mount works too; outside the Pod it
	// is refused.
	if _, err := Open(layout, subtree, filepath.Join(mount, cg)); err != nil {
		t.Errorf("Open(absolute) = %v", err)
	}
	if _, err := Open(layout, subtree, "/kubepods.slice"); !errors.Is(err, ErrOutsideSubtree) {
		t.Errorf("Open(outside the pod) error = %v; want ErrOutsideSubtree", err)
	}
	if _, err := Open(layout, "", ""); err == nil {
		t.Error("Open(\"\") accepted no cgroup")
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
