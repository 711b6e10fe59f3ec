package controlplane

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// process is one child of the control plane. Each runs in its own process
// group (so a terminal's Ctrl-C reaches only us, and we decide the order of
// shutdown) with PDEATHSIG=SIGKILL, so even if the test binary is killed
// with SIGKILL the kernel takes the children down with it.
type process struct {
	name    string
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

func startProcess(name, logPath string, argv ...string) (*process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	reply := make(chan error, 1)
	getSpawner().reqs <- spawnReq{cmd: cmd, reply: reply}
	if err := <-reply; err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has already ended, with its error.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.waitErr
	default:
		return false, nil
	}
}

// stop sends SIGTERM to the process group, waits up to grace, then SIGKILLs
// the group, and waits for the process to be reaped.
func (p *process) stop(grace time.Duration) {
	if p == nil {
		return
	}
	if done, _ := p.exited(); done {
		return
	}
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
	// Anything the child left in its group goes too.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}

// logTail returns the last n bytes of the process log, for error messages
// that say why a component did not come up.
func (p *process) logTail(n int64) string {
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

var errExited = errors.New("exited")
