package stack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"labkeep/localrun/childproc"
	"labkeep/localrun/controlplane"
	"labkeep/localrun/node"
	"labkeep/localrun/poll"
)

// footprint is everything a running stack owns on the machine.
type footprint struct {
	// Pids are the process group leaders: etcd, apiserver, kcm,
	// postmaster, and the node's containerd, kubelet and kube-scheduler.
	Pids  []int
	Ports []int    // loopback ports of the control plane
	Dirs  []string // temp dirs of the control plane, PostgreSQL and node
	// NodeDir is the node's temp dir, which its host link's alias names;
	// CgroupRoot is its kubelet's cgroup root.
	NodeDir, CgroupRoot string
}

func footprintOf(s *Stack) footprint {
	return footprint{
		Pids:       append(append(s.CP.Pids(), s.PG.Pid()), s.Node.Pids()...),
		Ports:      s.CP.Ports,
		Dirs:       []string{s.CP.Dir, s.PG.Dir(), s.Node.Dir},
		NodeDir:    s.Node.Dir,
		CgroupRoot: s.Node.CgroupRoot,
	}
}

// stackPids is the number of process groups of a stack with a node: the
// control plane's three, PostgreSQL, and the node's containerd, kubelet,
// scheduler, kube-proxy and policy engine.
const stackPids = 9

// nodeOpts is the node of these tests: without the workspace image, which
// they do not run.
var nodeOpts = node.Options{NoWorkspaceImage: true}

// groupMembers describes the processes of process group pgid, as
// "pid comm state" from /proc, for failure messages.
func groupMembers(pgid int) []string {
	var out []string
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces, so split
		// after its closing parenthesis.
		i := bytes.LastIndexByte(b, ')')
		j := bytes.IndexByte(b, '(')
		if i < 0 || j < 0 {
			continue
		}
		fields := strings.Fields(string(b[i+1:]))
		if len(fields) >= 3 && fields[2] == strconv.Itoa(pgid) {
			out = append(out, fmt.Sprintf("%s %s %s", strings.TrimSpace(string(b[:j])), b[j+1:i], fields[0]))
		}
	}
	return out
}

// assertGone fails unless no process of any of fp's process groups is
// left, no port accepts connections and no dir exists.
func assertGone(t *testing.T, what string, fp footprint, wait time.Duration) {
	t.Helper()
	poll.Eventually(t, wait, func() (bool, string) {
		for _, pid := range fp.Pids {
			if syscall.Kill(-pid, 0) == nil { // the whole group: postgres backends too
				return false, fmt.Sprintf("%s: process group %d still has processes %v", what, pid, groupMembers(pid))
			}
		}
		return true, ""
	})
	for _, port := range fp.Ports {
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second); err == nil {
			c.Close()
			t.Fatalf("%s: port %d still accepts connections", what, port)
		}
	}
	for _, d := range fp.Dirs {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: dir %s still exists (%v)", what, d, err)
		}
	}
	if fp.NodeDir != "" {
		if b := node.LinkOf(fp.NodeDir); b != "" {
			t.Fatalf("%s: link %s of the node still exists", what, b)
		}
	}
	if fp.CgroupRoot != "" {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/memory", fp.CgroupRoot)); err == nil {
			t.Fatalf("%s: cgroup %s still exists", what, fp.CgroupRoot)
		}
	}
}

// tempRoot is a temp dir the postgres user can traverse (t.TempDir sits in a 0700 dir).
func tempRoot(t *testing.T) string {
	t.Helper()
	root, err := os.MkdirTemp("", "labkeep-stacktest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

// Starting and stopping the whole stack (node included) 10 times leaves no
// process, listening port, temp dir, host link or cgroup behind; each time PostgreSQL
// accepts a pgx connection and is gone after Stop.
func TestStartStopTenTimesLeavesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 10 stacks")
	}
	root := tempRoot(t)
	ctx := context.Background()
	for i := range 10 {
		start := time.Now()
		s, err := Start(ctx, Options{ControlPlane: controlplane.Options{TempRoot: root}, Node: nodeOpts})
		if err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
		up := time.Since(start)
		conn, err := pgx.Connect(ctx, s.DSN())
		if err != nil {
			s.Stop()
			t.Fatalf("run %d: pgx connect: %v", i, err)
		}
		conn.Close(ctx)
		fp := footprintOf(s)
		if len(fp.Pids) != stackPids || len(fp.Ports) != 4 {
			s.Stop()
			t.Fatalf("run %d: unexpected footprint %+v", i, fp)
		}
		stopStart := time.Now()
		if err := s.Stop(); err != nil {
			t.Fatalf("run %d: stop: %v", i, err)
		}
		assertGone(t, fmt.Sprintf("run %d", i), fp, 0)
		t.Logf("run %d: up in %s, stopped in %s", i, up.Round(10*time.Millisecond), time.Since(stopStart).Round(10*time.Millisecond))
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Fatalf("temp root not empty after 10 runs: %d entries", len(entries))
	}
}

// The owner of a stack dies without running any cleanup (SIGKILL, or a
// panic): its components die with it, and the next start removes its
// files. On SIGINT/SIGTERM with StopOnSignal, everything is cleaned at once.
func TestOwnerDeathLeavesNothing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		signal syscall.Signal
	}{
		{"SIGKILL: no cleanup code runs", syscall.SIGKILL},
		{"SIGINT: Ctrl-C on a test run", syscall.SIGINT},
		{"SIGTERM", syscall.SIGTERM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := tempRoot(t)
			cmd, fp, err := childproc.StartOwner("TestHelperOwnerProcess", []string{"LABKEEP_TEST_OWNER_ROOT=" + root},
				func(fp footprint) bool { return len(fp.Pids) > 0 })
			if err != nil {
				t.Fatal(err)
			}
			if len(fp.Pids) != stackPids {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("helper reported %d process groups, want a running stack's %d", len(fp.Pids), stackPids)
			}
			if err := cmd.Process.Signal(tc.signal); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			if tc.signal == syscall.SIGKILL {
				// Processes die at once (PDEATHSIG); the dirs are swept by
				// the next start under the same root.
				killed := time.Now()
				assertGone(t, "after SIGKILL", footprint{Pids: fp.Pids, Ports: fp.Ports}, 10*time.Second)
				t.Logf("every process gone %s after SIGKILL of the owner", time.Since(killed).Round(10*time.Millisecond))
				s, err := Start(context.Background(), Options{NoVirtSim: true, ControlPlane: controlplane.Options{TempRoot: root}, Node: nodeOpts})
				if err != nil {
					t.Fatal(err)
				}
				s.Stop()
			}
			assertGone(t, tc.name, fp, 10*time.Second)
		})
	}
}

// TestHelperOwnerProcess is not a test: TestOwnerDeathLeavesNothing runs the
// test binary again with this as the only test, as the owner to kill.
func TestHelperOwnerProcess(t *testing.T) {
	root := os.Getenv("LABKEEP_TEST_OWNER_ROOT")
	if root == "" {
		t.Skip("helper process for TestOwnerDeathLeavesNothing")
	}
	s, err := Start(context.Background(), Options{StopOnSignal: true, ControlPlane: controlplane.Options{TempRoot: root}, Node: nodeOpts})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(footprintOf(s))
	fmt.Printf("\n%s\n", b)
	time.Sleep(5 * time.Minute)
	s.Stop()
}
