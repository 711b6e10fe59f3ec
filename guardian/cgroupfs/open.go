package cgroupfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Layout is where the cgroup hierarchies are mounted.
type Layout struct {
	V1 map[string]string // v1 controller → mount point
	V2 string            // cgroup2 mount point, "" if none
}

// ReadLayout reads the cgroup mounts of this process (/proc/self/mountinfo)
// at or below prefix ("/" for all). In a Pod the host's cgroupfs is mounted
// at a prefix such as /host/sys/fs/cgroup next to the container's own,
// namespaced, read-only /sys/fs/cgroup, which must not be picked.
func ReadLayout(prefix string) (Layout, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return Layout{}, err
	}
	prefix = filepath.Clean(prefix)
	var kept []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && within(prefix, filepath.Clean(f[4])) {
			kept = append(kept, line)
		}
	}
	v1, v2 := MountsV1(strings.Join(kept, "\n"))
	if len(v1) == 0 && v2 == "" {
		return Layout{}, fmt.Errorf("no cgroup mount at or below %s", prefix)
	}
	return Layout{V1: v1, V2: v2}, nil
}

// IsV1 reports whether the memory controller lives on a v1 hierarchy (v1 or
// hybrid layout): guardian then works on v1.
func (l Layout) IsV1() bool { _, ok := l.V1["memory"]; return ok }

// Mount returns where cgroup paths are resolved for discovery: the v1 memory
// mount or the v2 mount.
func (l Layout) Mount() string {
	if l.IsV1() {
		return l.V1["memory"]
	}
	return l.V2
}

// Open opens the workspace cgroup given explicitly: on v1 a path relative
// to each controller mount, on v2 a directory (absolute, under the mount)
// or a path relative to the mount. subtree bounds what may be touched and
// defaults to the cgroup itself.
func Open(l Layout, subtree, cgroup string) (Cgroup, error) {
	if cgroup == "" {
		return nil, errors.New("no cgroup given")
	}
	if l.IsV1() {
		if subtree == "" {
			subtree = cgroup
		}
		return OpenV1(l.V1, subtree, cgroup)
	}
	if l.V2 == "" {
		return nil, errors.New("no cgroup v1 memory controller and no cgroup2 mount")
	}
	rel := cgroup
	if filepath.IsAbs(cgroup) && within(l.V2, filepath.Clean(cgroup)) {
		rel = strings.TrimPrefix(filepath.Clean(cgroup), filepath.Clean(l.V2))
	}
	if subtree == "" {
		subtree = rel
	} else if filepath.IsAbs(subtree) && within(l.V2, filepath.Clean(subtree)) {
		subtree = strings.TrimPrefix(filepath.Clean(subtree), filepath.Clean(l.V2))
	}
	return OpenV2(l.V2, subtree, rel)
}
