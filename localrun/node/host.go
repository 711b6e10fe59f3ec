package node

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroupMount is where this host's cgroup v1 hierarchies are mounted.
const cgroupMount = "/sys/fs/cgroup"

// hierarchies returns the mounted cgroup hierarchies (v1 controllers, the
// name=systemd one and, on a hybrid host, the unified one).
func hierarchies() []string {
	entries, _ := os.ReadDir(cgroupMount)
	var hs []string
	for _, e := range entries {
		p := filepath.Join(cgroupMount, e.Name())
		if _, err := os.Stat(filepath.Join(p, "cgroup.procs")); err == nil {
			hs = append(hs, p)
		}
	}
	return hs
}

// makeCgroupRoot creates the kubelet's cgroup root in every hierarchy (the
// kubelet refuses to start when it is missing). Each node has its own, so
// that one node's kubelet never takes another's Pod cgroups for orphans.
// A new cpuset cgroup starts with no CPUs and no memory nodes; it gets its
// parent's.
func makeCgroupRoot(root string) error {
	for _, h := range hierarchies() {
		p := filepath.Join(h, root)
		if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		if filepath.Base(h) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(h, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(p, f), v, 0o644); err != nil {
					return fmt.Errorf("%s: %w", filepath.Join(p, f), err)
				}
			}
		}
	}
	return nil
}

// removeCgroupRoot removes root and everything below it in every
// hierarchy, deepest first. A cgroup can only be removed once its last
// process has been reaped, which may take a moment after a PID namespace
// dies; a process still in there after that is one of the node's own
// containers, and is killed.
func removeCgroupRoot(root string) error {
	var errs []error
	for _, h := range hierarchies() {
		top := filepath.Join(h, root)
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			deadline := time.Now().Add(10 * time.Second)
			for {
				err := syscall.Rmdir(d)
				if err == nil || errors.Is(err, syscall.ENOENT) {
					break
				}
				if time.Now().After(deadline) {
					errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
					break
				}
				killCgroup(d)
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	return errors.Join(errs...)
}

// killCgroup SIGKILLs every process in the cgroup dir (not below it).
func killCgroup(dir string) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// mountsUnder returns the mount points at or below dir in this mount
// namespace, deepest first.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var mps []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			mps = append(mps, mp)
		}
	}
	sort.SliceStable(mps, func(i, j int) bool { return len(mps[i]) > len(mps[j]) })
	return mps
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountUnder detaches every mount at or below dir (the kubelet's volume
// mounts, and the shared bind mount of its directory; a mount stacked on
// another shows up twice and is unmounted twice).
func unmountUnder(dir string) error {
	if dir == "" {
		return nil
	}
	for range 10 {
		mps := mountsUnder(dir)
		if len(mps) == 0 {
			return nil
		}
		for _, mp := range mps {
			_ = syscall.Unmount(mp, syscall.MNT_DETACH)
		}
	}
	if mps := mountsUnder(dir); len(mps) > 0 {
		return fmt.Errorf("mounts left under %s: %v", dir, mps)
	}
	return nil
}

// sweepStale removes what nodes whose owner died without a Stop left on
// the host: their temp dirs under tempRoot (mounts first), their cgroup
// roots and their bridges. The processes are gone already: they died with
// their owner.
func sweepStale(tempRoot string) {
	if tempRoot == "" {
		tempRoot = os.TempDir()
	}
	sweepLinks()
	stale := map[string]bool{}
	dirs, _ := filepath.Glob(filepath.Join(tempRoot, dirPrefix+"-*-*"))
	for _, d := range dirs {
		if ownerGone(filepath.Base(d)) {
			stale[filepath.Base(d)] = true
			_ = unmountUnder(d)
			_ = os.RemoveAll(d)
		}
	}
	for _, h := range hierarchies() {
		cgs, _ := filepath.Glob(filepath.Join(h, dirPrefix+"-*-*"))
		for _, c := range cgs {
			if base := filepath.Base(c); stale[base] || ownerGone(base) {
				stale[base] = true
			}
		}
	}
	for base := range stale {
		_ = removeCgroupRoot("/" + base)
	}
}

// ownerGone reports whether base, a "<dirPrefix>-<pid>-<random>" name,
// belongs to a process that no longer exists.
func ownerGone(base string) bool {
	rest := strings.TrimPrefix(base, dirPrefix+"-")
	pidStr, _, ok := strings.Cut(rest, "-")
	if !ok {
		return false
	}
	pid, err := strconv.Atoi(pidStr)
	if err != nil || pid == os.Getpid() {
		return false
	}
	return !processExists(pid)
}
