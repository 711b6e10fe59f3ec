// Package childproc starts the local stack's server processes so that they
// can never outlive the program that started them: each runs in its own
// process group with PDEATHSIG=SIGKILL, set from one OS thread that never
// exits. Even a test binary killed with SIGKILL takes its etcd, API server
// and PostgreSQL down with it.
package childproc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is one child. Its own process group means a terminal's Ctrl-C
// reaches only the parent, which decides the order of shutdown.
type Process struct {
	Name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	waitErr error
}

// spawner starts children from one OS thread that never exits: PDEATHSIG
// fires when the *thread* that forked the child dies, and the Go runtime may
// retire an ordinary thread at any time.
type spawner struct {
	reqs chan spawnReq
}

type spawnReq struct {
	cmd   *exec.Cmd
	reply chan error
}

var (
	theSpawner     *spawner
	theSpawnerOnce sync.Once
)

func getSpawner() *spawner {
	theSpawnerOnce.Do(func() {
		s := &spawner{reqs: make(chan spawnReq)}
		go func() {
			runtime.LockOSThread() // never unlocked: this thread lives as long as the process
			for r := range s.reqs {
				r.reply <- r.cmd.Start()
			}
		}()
		theSpawner = s
	})
	return theSpawner
}

// Attr are optional settings of a child.
type Attr struct {
	Credential *syscall.Credential // run as this user (nil = as the parent)
	Env        []string            // nil = the parent's environment
	Dir        string
}

// Start runs argv with stdout and stderr appended to logPath.
func Start(name, logPath string, attr Attr, argv ...string) (*Process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: attr.Credential}
	cmd.Env, cmd.Dir = attr.Env, attr.Dir
	reply := make(chan error, 1)
	getSpawner().reqs <- spawnReq{cmd: cmd, reply: reply}
	if err := <-reply; err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid is the child's process id (also its process group id).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has already ended, with its error.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.waitErr
	default:
		return false, nil
	}
}

// Stop sends sig to the process group, waits up to grace, then SIGKILLs
// the group, waits for the process to be reaped, and returns once nothing
// of its group is left (bounded by groupGone): a program the child was
// running (such as an iptables or ipset call of kube-proxy or kube-router)
// dies a moment after the signal, and a caller that checks for leftovers
// must not see it.
func (p *Process) Stop(sig syscall.Signal, grace time.Duration) {
	if p == nil {
		return
	}
	if done, _ := p.Exited(); done {
		return
	}
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, sig)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
	// Anything the child left in its group goes too.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	for deadline := time.Now().Add(groupGone); syscall.Kill(-pgid, 0) == nil && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
}

// groupGone bounds how long Stop waits for the kernel to take the killed
// members of a child's process group.
const groupGone = 5 * time.Second

// LogTail returns the last n bytes of the process log, for error messages
// that say why a component did not come up.
func (p *Process) LogTail(n int64) string {
	f, err := os.Open(p.logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := st.Size() - n
	if off < 0 {
		off = 0
	}
	buf := make([]byte, st.Size()-off)
	_, _ = f.ReadAt(buf, off)
	return strings.TrimSpace(string(buf))
}

// ErrExited is wrapped by callers reporting a child that died during start-up.
var ErrExited = errors.New("exited")

// TempDir makes a temp dir named <prefix>-<our pid>-<random> under root, the
// form SweepStale recognises.
func TempDir(root, prefix string) (string, error) {
	return os.MkdirTemp(root, fmt.Sprintf("%s-%d-", prefix, os.Getpid()))
}

// SweepStale removes the TempDir dirs under root ("" = os.TempDir) whose
// creating process is gone: a program killed with SIGKILL can run no
// cleanup, but its children died with it (PDEATHSIG) and its files are
// removed by the next start.
func SweepStale(root, prefix string) {
	if root == "" {
		root = os.TempDir()
	}
	matches, _ := filepath.Glob(filepath.Join(root, prefix+"-*-*"))
	for _, m := range matches {
		rest := strings.TrimPrefix(filepath.Base(m), prefix+"-")
		pidStr, _, ok := strings.Cut(rest, "-")
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(m)
		}
	}
}
