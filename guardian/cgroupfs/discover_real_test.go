package cgroupfs

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/guardian/internal/poll"
	"labkeep/guardian/internal/testcgroup"
)

// Discovery on the real cgroup2 mount, with real processes in a Pod laid
// out as the kubelet lays it out on v2 (systemd and cgroupfs drivers): the
// sandbox, a stand-in for guardian, the workspace, and later a debug
// container. PIDs come from the kernel's cgroup.procs, environments from
// /proc.
func TestPodWorkspaceRealV2(t *testing.T) {
	const uid = "6a1d0c2e-3f4b-4c5d-8e9f-0a1b2c3d4e5f"
	layouts := []struct {
		name, pod string
		id        func(string) string
	}{
		{"systemd driver", "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice",
			func(id string) string { return "cri-containerd-" + id + ".scope" }},
		{"cgroupfs driver", "kubepods/besteffort/pod" + uid, func(id string) string { return id }},
	}
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			root := testcgroup.NewV2(t)
			mkcg := func(rel string) string {
				t.Helper()
				dir := filepath.Join(root, rel)
				if err := os.Mkdir(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { removeCgroup(t, dir) })
				return dir
			}
			var rel string
			for _, part := range strings.Split(l.pod, "/") {
				rel = filepath.Join(rel, part)
				mkcg(rel)
			}
			run := func(id string, env ...string) *exec.Cmd {
				t.Helper()
				cmd := testcgroup.CommandV2(mkcg(filepath.Join(rel, l.id(id))), "/bin/sleep", "infinity")
				cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, env...)
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
				return cmd
			}
			sandbox := run("5a4d")
			self := run("9e1f", "CONTAINER_NAME=workspace")
			mount, _ := filepath.Rel(testcgroup.V2Root, root)
			pod := "/" + filepath.Join(mount, rel)
			w := &PodWorkspace{Layout: Layout{V2: testcgroup.V2Root}, ProcRoot: "/proc", PodUID: uid, ContainerName: "workspace",
				SelfPID: self.Process.Pid, SandboxPID: sandbox.Process.Pid}
			if _, _, _, err := w.Locate(); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Locate() before the workspace started = %v; want ErrNotFound", err)
			}
			// guardian's own cgroup is found before the workspace exists.
			var own Cgroup
			var err error
			if !poll.Until(10*time.Second, func() bool { own, err = w.Own(); return err == nil }) {
				t.Fatalf("Own() = %v", err)
			}
			if pids, err := own.Procs(); err != nil || len(pids) != 1 || pids[0] != self.Process.Pid {
				t.Errorf("guardian's own cgroup's processes = %v, %v; want [%d]", pids, err, self.Process.Pid)
			}
			ws := run("c0de", "LABKEEP_CONTAINER_NAME=workspace")
			wantWS := filepath.Join(pod, l.id("c0de"))
			want := []Container{{filepath.Join(pod, l.id("5a4d")), RoleSandbox}, {filepath.Join(pod, l.id("9e1f")), RoleSelf}, {wantWS, RoleWorkspace}}
			locate := func(want []Container) {
				t.Helper()
				var got string
				var seen []Container
				var err error
				if !poll.Until(10*time.Second, func() bool { got, _, seen, err = w.Locate(); return cmp.Equal(want, seen) }) {
					t.Fatalf("containers (-want +got):\n%s", cmp.Diff(want, seen))
				}
				if err != nil || got != wantWS {
					t.Errorf("Locate() = %q, %v; want %q", got, err, wantWS)
				}
			}
			locate(want)
			// An ephemeral debug container joins: the marker decides.
			run("debug")
			locate(append(want, Container{filepath.Join(pod, l.id("debug")), RoleOther}))
			cg, err := w.Find()
			if err != nil {
				t.Fatal(err)
			}
			if pids, err := cg.Procs(); err != nil || len(pids) != 1 || pids[0] != ws.Process.Pid {
				t.Errorf("the workspace cgroup's processes = %v, %v; want [%d]", pids, err, ws.Process.Pid)
			}
		})
	}
}

// removeCgroup removes a cgroup2 directory once its processes are gone.
func removeCgroup(t *testing.T, dir string) {
	t.Helper()
	var err error
	for i := 0; i < 250; i++ {
		if err = os.Remove(dir); err == nil || os.IsNotExist(err) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("remove cgroup %s: %v", dir, err)
}
