package cgroupfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// ErrNotFound is returned when discovery finds no matching cgroup.
var ErrNotFound = errors.New("cgroup not found")

var podUIDPattern = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// PodDirNames returns the directory names a Pod's cgroup has under the
// cgroupfs driver ("pod<uid>") and the systemd driver
// ("kubepods-<qos>-pod<uid with _>.slice"; matched by suffix). Returns an
// error for a malformed UID so that a bad environment cannot widen the search.
func PodDirNames(podUID string) (cgroupfsName, systemdSuffix string, err error) {
	if !podUIDPattern.MatchString(podUID) {
		return "", "", fmt.Errorf("POD_UID %q is not a UID", podUID)
	}
	return "pod" + podUID, "-pod" + strings.ReplaceAll(podUID, "-", "_") + ".slice", nil
}

// FindPod walks mount (at most 4 levels, never following symlinks) for the
// Pod's cgroup directory and returns its path relative to mount.
func FindPod(mount, podUID string) (string, error) {
	plain, systemd, err := PodDirNames(podUID)
	if err != nil {
		return "", err
	}
	root := filepath.Clean(mount)
	var found string
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == root {
				return err
			}
			return fs.SkipDir
		}
		if !d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		depth := strings.Count(rel, "/") + 1
		if rel != "." && (d.Name() == plain || strings.HasSuffix(d.Name(), systemd)) {
			found = rel
			return fs.SkipAll
		}
		if rel != "." && depth >= 4 {
			return fs.SkipDir
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	if found == "" {
		return "", fmt.Errorf("pod %s under %s: %w", podUID, mount, ErrNotFound)
	}
	return "/" + found, nil
}

// ContainerCandidates lists the container cgroups of a Pod (relative to
// mount), leaving out exclude (guardian's own cgroup) and conmon scopes.
func ContainerCandidates(mount, podRel, exclude string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(mount, podRel))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() || strings.Contains(e.Name(), "conmon") {
			continue
		}
		rel := filepath.Join(podRel, e.Name())
		if filepath.Clean(exclude) == rel {
			continue
		}
		out = append(out, rel)
	}
	return out, nil
}

// PickContainer chooses the workspace container among candidates: the one
// isWorkspace accepts (it looks at the processes, e.g. their environment),
// else the only candidate that is not the Pod's pause (sandbox) container.
// Returns ErrNotFound when none or more than one qualifies.
func PickContainer(candidates []string, isWorkspace, isPause func(rel string) bool) (string, error) {
	var others []string
	for _, c := range candidates {
		if isWorkspace(c) {
			return c, nil
		}
		if !isPause(c) {
			others = append(others, c)
		}
	}
	if len(others) == 1 {
		return others[0], nil
	}
	return "", fmt.Errorf("workspace container among %v: %w", candidates, ErrNotFound)
}

// OwnCgroup returns this process's cgroup path for a v1 controller (or the
// v2 path when controller is "") from /proc/self/cgroup content.
func OwnCgroup(procSelfCgroup, controller string) (string, error) {
	for _, line := range strings.Split(procSelfCgroup, "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if controller == "" && f[0] == "0" && f[1] == "" {
			return f[2], nil
		}
		for _, c := range strings.Split(f[1], ",") {
			if controller != "" && c == controller {
				return f[2], nil
			}
		}
	}
	return "", fmt.Errorf("controller %q in /proc/self/cgroup: %w", controller, ErrNotFound)
}
