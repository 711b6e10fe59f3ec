package procfs

import (
	"fmt"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"labkeep/guardian/victim"
)

// ExeFile returns the device and inode of the file pid executes, stat'ed
// through /proc/PID/exe: that is the file the kernel mapped, even when the
// path now names another file or none. Reading it needs the same access
// as reading the link (CAP_SYS_PTRACE for other users' processes).
func (fs *FS) ExeFile(pid int) (victim.FileID, error) {
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(fs.Root, strconv.Itoa(pid), "exe"), &st); err != nil {
		return victim.FileID{}, gone(pid, fmt.Errorf("stat /proc/%d/exe: %w", pid, err))
	}
	return victim.FileID{Dev: st.Dev, Ino: st.Ino}, nil
}

// FileInRoot returns the device and inode of path as seen from pid's root
// directory (/proc/PID/root), the container's filesystem for a process in
// the container. Symbolic links and ".." are resolved inside that root
// (openat2 RESOLVE_IN_ROOT), never on the host's.
func (fs *FS) FileInRoot(pid int, path string) (victim.FileID, error) {
	root, err := unix.Open(filepath.Join(fs.Root, strconv.Itoa(pid), "root"), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return victim.FileID{}, gone(pid, fmt.Errorf("open /proc/%d/root: %w", pid, err))
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, path, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return victim.FileID{}, fmt.Errorf("%s in the root of pid %d: %w", path, pid, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return victim.FileID{}, fmt.Errorf("stat %s in the root of pid %d: %w", path, pid, err)
	}
	return victim.FileID{Dev: st.Dev, Ino: st.Ino}, nil
}
