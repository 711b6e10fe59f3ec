package cgroupfs

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
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

// Role is what discovery makes of one container cgroup of the Pod.
type Role string

// Roles of a Pod's container cgroups.
const (
	RoleSelf      Role = "guardian"  // holds guardian's own process
	RoleSandbox   Role = "sandbox"   // holds the Pod's sandbox (pause) process
	RoleEmpty     Role = "empty"     // no visible process: not started yet, gone, or outside guardian's PID namespace
	RoleWorkspace Role = "workspace" // a process carries the workspace marker in its environment
	RoleOther     Role = "other"     // anything else (another container, an ephemeral debug container)
)

// WorkspaceMarker is the environment variable the Pod spec sets on the
// workspace container, with the container's name as its value.
const WorkspaceMarker = "LABKEEP_CONTAINER_NAME"

// Classify gives a container cgroup its role from the PIDs in it (as
// guardian's PID namespace shows them). The roles are structural wherever
// possible: guardian's own cgroup is the one holding selfPID, the sandbox's
// the one holding sandboxPID (PID 1 of the shared PID namespace); only the
// workspace is recognised by hasMarker, which looks at a process's
// environment.
func Classify(pids []int, selfPID, sandboxPID int, hasMarker func(pid int) bool) Role {
	if len(pids) == 0 {
		return RoleEmpty
	}
	for _, p := range pids {
		switch p {
		case selfPID:
			return RoleSelf
		case sandboxPID:
			return RoleSandbox
		}
	}
	for _, p := range pids {
		if hasMarker(p) {
			return RoleWorkspace
		}
	}
	return RoleOther
}

// Container is one container cgroup of a Pod, relative to the mount.
type Container struct {
	Rel  string
	Role Role
}

// PickWorkspace chooses the workspace among a Pod's container cgroups.
// With guardian's own and the sandbox's ruled out by their PIDs and empty
// ones by having no process, what is left are the Pod's app containers:
// the workspace Pod has one, so a single one left is the workspace. Only
// when more are left (an ephemeral debug container, say) does the marker
// decide, and then exactly one must carry it. Nothing left is
// ErrNotFound (not started yet, or restarting); an undecidable choice is
// refused rather than guessed.
func PickWorkspace(cs []Container) (string, error) {
	var marked, apps []string
	for _, c := range cs {
		switch c.Role {
		case RoleWorkspace:
			marked = append(marked, c.Rel)
			apps = append(apps, c.Rel)
		case RoleOther:
			apps = append(apps, c.Rel)
		}
	}
	switch {
	case len(apps) == 1:
		return apps[0], nil
	case len(apps) == 0:
		return "", fmt.Errorf("no workspace container among %v: %w", cs, ErrNotFound)
	case len(marked) == 1:
		return marked[0], nil
	default:
		return "", fmt.Errorf("%d app containers (%v), %d of them carrying the workspace marker: refusing to guess", len(apps), apps, len(marked))
	}
}

// PodWorkspace locates the workspace container's cgroup of one Pod from
// guardian's place in it, as a native sidecar sees the Pod: started before
// the workspace container exists, in the Pod's shared PID namespace
// (shareProcessNamespace: true, so PID 1 is the sandbox), with the host's
// cgroup hierarchy mounted and possibly a private cgroup namespace (on v2
// /proc/self/cgroup then reads "0::/", so guardian's own path cannot be
// read from it).
//
// How the workspace is told apart, and why:
//   - the Pod's directory comes from POD_UID (cgroupfs or systemd naming);
//   - guardian's own cgroup and the sandbox's are found by the PIDs in them
//     (guardian's own PID, PID 1), which works on v1 and v2, with or without
//     a cgroup namespace, and needs no name; a cgroup with no visible
//     process is not a running container;
//   - what is left are the Pod's app containers, and the workspace Pod has
//     exactly one. Only if there are more (an ephemeral debug container)
//     does the marker decide: LABKEEP_CONTAINER_NAME=<name>, which the Pod
//     spec sets on the workspace, found in a process's environment. The
//     marker cannot be the primary key: sshd, the workspace's main process,
//     rewrites its process title over its environment block (setproctitle),
//     so /proc/PID/environ of the container's main process no longer shows
//     it, and sshd gives its sessions a fresh environment.
//   - Other ways were weighed: the container ID in the cgroup path needs
//     the API or CRI to learn the ID; HOSTNAME is the same in every
//     container of a Pod; a shared file needs the workspace image's help;
//     process names can be chosen by anyone.
//
// A new container's cgroup can be found while the runtime is still
// setting it up (its init runs in the cgroup before the runtime writes the
// container's limits); guardian re-asserts its limits on every watch, so
// it does not lose to the runtime's write.
//
// Discovery only picks which cgroup to guard. It never grants protection:
// the protected set is decided by package victim from process identity,
// and the user, confined to the workspace cgroup, cannot place a process
// in another of the Pod's cgroups.
type PodWorkspace struct {
	Layout        Layout
	ProcRoot      string // guardian's /proc, showing the Pod's shared PID namespace
	PodUID        string
	ContainerName string // the marker's value
	SelfPID       int    // guardian's PID as ProcRoot shows it
	SandboxPID    int    // the sandbox's PID; 1 in a shared PID namespace

	pod string // the Pod's directory once found; it lives as long as the Pod
	own Cgroup // guardian's own container cgroup once found; it lives as long as guardian
}

// Locate returns the workspace container's cgroup and the Pod's directory
// (both relative to the mount), or an error wrapping ErrNotFound while the
// workspace has no live cgroup. It also returns what it made of every
// container cgroup, for logs.
func (w *PodWorkspace) Locate() (cgroup, pod string, seen []Container, err error) {
	mount := w.Layout.Mount()
	if w.pod == "" {
		if w.pod, err = FindPod(mount, w.PodUID); err != nil {
			return "", "", nil, err
		}
	}
	entries, err := os.ReadDir(filepath.Join(mount, w.pod))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			err = fmt.Errorf("pod %s: %w", w.PodUID, ErrNotFound)
		}
		return "", w.pod, nil, err
	}
	marker := []byte(WorkspaceMarker + "=" + w.ContainerName + "\x00")
	hasMarker := func(pid int) bool {
		env, err := os.ReadFile(filepath.Join(w.ProcRoot, strconv.Itoa(pid), "environ"))
		return err == nil && w.ContainerName != "" && bytes.Contains(append([]byte("\x00"), env...), append([]byte("\x00"), marker...))
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		rel := filepath.Join(w.pod, e.Name())
		pids, _ := readProcs(filepath.Join(mount, rel)) // a cgroup removed meanwhile reads as empty
		seen = append(seen, Container{Rel: rel, Role: Classify(pids, w.SelfPID, w.SandboxPID, hasMarker)})
	}
	cgroup, err = PickWorkspace(seen)
	if err != nil {
		return "", w.pod, seen, fmt.Errorf("pod %s container %q: %w", w.PodUID, w.ContainerName, err)
	}
	return cgroup, w.pod, seen, nil
}

// Find implements guard.Workspace: it locates the workspace and opens its
// cgroup confined to the Pod's directory.
func (w *PodWorkspace) Find() (Cgroup, error) {
	rel, pod, _, err := w.Locate()
	if err != nil {
		return nil, err
	}
	return Open(w.Layout, pod, rel)
}

// Own opens guardian's own container cgroup, the one holding SelfPID,
// confined to the Pod's directory, so that guardian can set its CPU weight
// against its siblings (guard.Config.OwnCPUWeight). It is located once:
// guardian's process never changes cgroup.
func (w *PodWorkspace) Own() (Cgroup, error) {
	if w.own != nil {
		return w.own, nil
	}
	_, pod, seen, err := w.Locate()
	for _, c := range seen {
		if c.Role == RoleSelf {
			if w.own, err = Open(w.Layout, pod, c.Rel); err != nil {
				return nil, err
			}
			return w.own, nil
		}
	}
	if seen == nil && err != nil {
		return nil, err // the Pod's directory is not readable
	}
	return nil, fmt.Errorf("pod %s: no container cgroup holds guardian's pid %d: %w", w.PodUID, w.SelfPID, ErrNotFound)
}

// Explicit is a cgroup given by path (GUARDIAN_CGROUP), for use outside
// Kubernetes; Find opens it again each time, so a cgroup removed and
// created anew is picked up.
type Explicit struct {
	Layout  Layout
	Subtree string // the subtree that may be touched; "": the cgroup itself
	Path    string
}

// Find implements guard.Workspace.
func (e Explicit) Find() (Cgroup, error) {
	c, err := Open(e.Layout, e.Subtree, e.Path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%v: %w", err, ErrNotFound)
	}
	return c, err
}

// Own implements guard.Workspace: outside a Pod guardian's own cgroup and
// its siblings are none of its business, so there is none (nil, nil).
func (e Explicit) Own() (Cgroup, error) { return nil, nil }

// readProcs reads one cgroup.procs file (this cgroup only, not children).
func readProcs(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if p, err := strconv.Atoi(f); err == nil {
			out = append(out, p)
		}
	}
	return out, nil
}
