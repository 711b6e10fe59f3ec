// Package procfs reads the process table guardian decides on from /proc:
// identity (PID, start time, executable, cgroup), parent, name, resident
// memory and CPU time, plus which process holds a listening TCP socket. It
// also sets oom_score_adj. Processes that vanish while being read are
// skipped, never reported as errors: in a fork bomb that is the normal case.
package procfs

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"labkeep/guardian/victim"
)

// ErrGone is returned when the process no longer exists (victim.ErrGone).
var ErrGone = victim.ErrGone

// FS reads a proc filesystem mounted at Root.
type FS struct {
	// Root is the proc mount, normally /proc.
	Root string
	// CgroupController picks the /proc/PID/cgroup line recorded in the
	// identity: a v1 controller name such as "memory", or "" for cgroup v2.
	CgroupController string
	pageSize         uint64
}

// New returns an FS for root.
func New(root, cgroupController string) *FS {
	return &FS{Root: root, CgroupController: cgroupController, pageSize: uint64(os.Getpagesize())}
}

// Snapshot reads the listed processes. Those that exit meanwhile, or whose
// files cannot be read, are left out: one odd process must not blind
// guardian to all the others. It fails only when none of a non-empty list
// could be read for another reason than having exited.
func (fs *FS) Snapshot(pids []int) ([]victim.Process, error) {
	out := make([]victim.Process, 0, len(pids))
	var firstErr error
	for _, pid := range pids {
		p, err := fs.Process(pid)
		if errors.Is(err, ErrGone) {
			continue
		}
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		out = append(out, p)
	}
	if len(out) == 0 && firstErr != nil {
		return nil, firstErr
	}
	return out, nil
}

// Process reads one process. Returns ErrGone if it does not exist (any more).
func (fs *FS) Process(pid int) (victim.Process, error) {
	dir := filepath.Join(fs.Root, strconv.Itoa(pid))
	b, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return victim.Process{}, gone(pid, err)
	}
	st, state, err := parseStat(string(b), fs.pageSize)
	if err != nil {
		return victim.Process{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	p := st.Process
	if state == "Z" || state == "X" || st.exiting {
		// An exiting process or a zombie is as good as gone: it frees its
		// memory, cannot be stopped from exiting, and the kernel already
		// reports it outside its cgroup.
		return victim.Process{}, fmt.Errorf("pid %d is exiting: %w", pid, ErrGone)
	}
	if p.PID != pid {
		return victim.Process{}, fmt.Errorf("/proc/%d/stat names pid %d", pid, p.PID)
	}
	p.Exe, err = fs.Exe(pid)
	if err != nil {
		return victim.Process{}, err
	}
	p.Cgroup, err = fs.Cgroup(pid)
	if err != nil {
		return victim.Process{}, err
	}
	return p, nil
}

// Identity re-reads the identity of pid now, for the check right before a
// signal. Returns ErrGone if it exited.
func (fs *FS) Identity(pid int) (victim.Identity, error) {
	p, err := fs.Process(pid)
	return p.Identity, err
}

// Exe returns the resolved executable of pid, "" for kernel threads,
// zombies and processes whose executable guardian may not read (then no
// configured-executable rule can match it, and the identity check still
// compares start times).
func (fs *FS) Exe(pid int) (string, error) {
	exe, err := os.Readlink(filepath.Join(fs.Root, strconv.Itoa(pid), "exe"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			// Kernel threads and zombies have no exe link; a vanished process
			// is caught by the next read.
			if _, serr := os.Stat(filepath.Join(fs.Root, strconv.Itoa(pid))); serr != nil {
				return "", gone(pid, serr)
			}
			return "", nil
		}
		if errors.Is(err, os.ErrPermission) {
			return "", nil
		}
		return "", gone(pid, err)
	}
	return strings.TrimSuffix(exe, " (deleted)"), nil
}

// Cgroup returns the cgroup path of pid for the configured controller.
func (fs *FS) Cgroup(pid int) (string, error) {
	b, err := os.ReadFile(filepath.Join(fs.Root, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return "", gone(pid, err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if fs.CgroupController == "" && f[0] == "0" && f[1] == "" {
			return f[2], nil
		}
		for _, c := range strings.Split(f[1], ",") {
			if fs.CgroupController != "" && c == fs.CgroupController {
				return f[2], nil
			}
		}
	}
	return "", nil
}

// OOMScoreAdj reads /proc/PID/oom_score_adj.
func (fs *FS) OOMScoreAdj(pid int) (int, error) {
	b, err := os.ReadFile(filepath.Join(fs.Root, strconv.Itoa(pid), "oom_score_adj"))
	if err != nil {
		return 0, gone(pid, err)
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// SetOOMScoreAdj writes /proc/PID/oom_score_adj (lowering it needs
// CAP_SYS_RESOURCE).
func (fs *FS) SetOOMScoreAdj(pid, adj int) error {
	err := os.WriteFile(filepath.Join(fs.Root, strconv.Itoa(pid), "oom_score_adj"), []byte(strconv.Itoa(adj)), 0)
	if err != nil {
		return gone(pid, err)
	}
	return nil
}

func gone(pid int, err error) error {
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, errESRCH) {
		return fmt.Errorf("pid %d: %w", pid, ErrGone)
	}
	return err
}

// parseStat parses /proc/PID/stat and returns the process and its state
// letter. The name may contain spaces and
// parentheses, so fields are counted from the last ')'.
type statInfo struct {
	victim.Process
	exiting bool // PF_EXITING in the flags field
}

// pfExiting is the kernel's PF_EXITING task flag.
const pfExiting = 0x4

func parseStat(s string, pageSize uint64) (statInfo, string, error) {
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return statInfo{}, "", errors.New("malformed stat")
	}
	pid, err := strconv.Atoi(strings.TrimSpace(s[:open]))
	if err != nil {
		return statInfo{}, "", err
	}
	// rest[0] is field 3 (state).
	rest := strings.Fields(s[closing+1:])
	if len(rest) < 22 {
		return statInfo{}, "", errors.New("short stat")
	}
	num := func(field int) uint64 {
		v, _ := strconv.ParseUint(rest[field-3], 10, 64)
		return v
	}
	return statInfo{Process: victim.Process{
		Identity: victim.Identity{PID: pid, StartTime: num(22)},
		PPID:     int(num(4)),
		State:    rest[0],
		Comm:     s[open+1 : closing],
		CPUTicks: num(14) + num(15),
		RSS:      num(24) * pageSize,
	}, exiting: num(9)&pfExiting != 0}, rest[0], nil
}

// ListeningInodes returns the socket inodes listening on TCP port (IPv4 and
// IPv6) in the network namespace of this proc mount.
func (fs *FS) ListeningInodes(port int) (map[uint64]bool, error) {
	out := map[uint64]bool{}
	found := false
	for _, name := range []string{"net/tcp", "net/tcp6"} {
		f, err := os.Open(filepath.Join(fs.Root, name))
		if err != nil {
			continue
		}
		found = true
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// sl local_address rem_address st ... uid timeout inode
			fl := strings.Fields(sc.Text())
			if len(fl) < 10 || fl[3] != "0A" {
				continue
			}
			i := strings.LastIndexByte(fl[1], ':')
			p, err := strconv.ParseUint(fl[1][i+1:], 16, 32)
			if err != nil || int(p) != port {
				continue
			}
			if ino, err := strconv.ParseUint(fl[9], 10, 64); err == nil && ino != 0 {
				out[ino] = true
			}
		}
		f.Close()
	}
	if !found {
		return nil, fmt.Errorf("no %s/net/tcp", fs.Root)
	}
	return out, nil
}

// SocketOwner returns the first of pids holding one of the socket inodes
// (reading /proc/PID/fd needs CAP_SYS_PTRACE for other users' processes).
// ok is false when none does.
func (fs *FS) SocketOwner(pids []int, inodes map[uint64]bool) (pid int, ok bool) {
	if len(inodes) == 0 {
		return 0, false
	}
	for _, p := range pids {
		fdDir := filepath.Join(fs.Root, strconv.Itoa(p), "fd")
		ents, err := os.ReadDir(fdDir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			l, err := os.Readlink(filepath.Join(fdDir, e.Name()))
			if err != nil || !strings.HasPrefix(l, "socket:[") {
				continue
			}
			ino, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]"), 10, 64)
			if err == nil && inodes[ino] {
				return p, true
			}
		}
	}
	return 0, false
}

var errESRCH error = unix.ESRCH

// HasCapability reports whether this process has capability c in its
// effective set (for example unix.CAP_SYS_RESOURCE, needed to lower
// oom_score_adj below 0), so guardian can say what it cannot do instead of
// failing on every attempt.
func HasCapability(c int) bool { return ProcessHasCapability("/proc", os.Getpid(), c) }

// ProcessHasCapability reports whether process pid (under proc mount root)
// has capability c in its effective set; false when it cannot be read.
func ProcessHasCapability(root string, pid, c int) bool {
	b, err := os.ReadFile(filepath.Join(root, strconv.Itoa(pid), "status"))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && mask&(1<<uint(c)) != 0
		}
	}
	return false
}
