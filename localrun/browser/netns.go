package browser

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"

	"labkeep/localrun/loopback"
)

// quietNet is a network namespace of the browser's own with only a
// loopback, in which the addresses it is to reach are forwarded to the
// same addresses outside. Chromium fails every request in flight when the
// machine's network changes (ERR_NETWORK_CHANGED), and on this machine it
// changes whenever a local node starts or stops a Pod (a veth appears and
// gets an address); inside its own namespace the browser sees none of it.
type quietNet struct {
	// path names the namespace (/proc/<pid>/task/<tid>/ns/net of the
	// thread that holds it), for nsenter.
	path string
	reqs chan listenReq
	done chan struct{}
	once sync.Once
	mu   sync.Mutex
	fwd  map[string]net.Listener
}

type listenReq struct {
	addr  string
	reply chan listenReply
}

type listenReply struct {
	ln  net.Listener
	err error
}

// newQuietNet makes the namespace: a goroutine locked to its OS thread
// unshares the thread's network namespace, brings up its loopback and
// creates every listener in it; the thread ends with the goroutine, so no
// other goroutine ever runs in that namespace.
func newQuietNet() (*quietNet, error) {
	q := &quietNet{reqs: make(chan listenReq), done: make(chan struct{}), fwd: map[string]net.Listener{}}
	ready := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ready <- fmt.Errorf("unshare network namespace: %w", err)
			return
		}
		if err := loopback.Up(); err != nil {
			ready <- err
			return
		}
		q.path = fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		ready <- nil
		for {
			select {
			case <-q.done:
				return
			case r := <-q.reqs:
				ln, err := net.Listen("tcp", r.addr)
				r.reply <- listenReply{ln, err}
			}
		}
	}()
	if err := <-ready; err != nil {
		return nil, err
	}
	return q, nil
}

// forward makes addr (host:port) inside the namespace lead to addr
// outside; forwarding an address twice is a no-op.
func (q *quietNet) forward(addr string) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.fwd[addr]; ok {
		return nil
	}
	reply := make(chan listenReply, 1)
	select {
	case q.reqs <- listenReq{addr, reply}:
	case <-q.done:
		return errors.New("the browser's network namespace is gone")
	}
	r := <-reply
	if r.err != nil {
		return fmt.Errorf("listening on %s in the browser's namespace: %w", addr, r.err)
	}
	q.fwd[addr] = r.ln
	go func() {
		for {
			in, err := r.ln.Accept()
			if err != nil {
				return
			}
			go pipe(in, addr)
		}
	}()
	return nil
}

// pipe copies between in and a new connection to addr outside.
func pipe(in net.Conn, addr string) {
	defer in.Close()
	out, err := net.Dial("tcp", addr)
	if err != nil {
		return
	}
	defer out.Close()
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if c, ok := dst.(*net.TCPConn); ok {
			_ = c.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(out, in)
	go cp(in, out)
	<-done
	<-done
}

// isolate makes a quietNet and, in dir, a wrapper that runs chromium in
// it (nsenter, util-linux); it returns both.
func isolate(dir, chromium string) (*quietNet, string, error) {
	q, err := newQuietNet()
	if err != nil {
		return nil, "", err
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		q.close()
		return nil, "", err
	}
	wrapper := filepath.Join(dir, "chromium-isolated")
	script := fmt.Sprintf("#!/bin/sh\nexec %s --net=%s -- %s \"$@\"\n", nsenter, q.path, chromium)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		q.close()
		return nil, "", err
	}
	return q, wrapper, nil
}

// close stops forwarding and lets the namespace's thread end.
func (q *quietNet) close() {
	q.once.Do(func() {
		close(q.done)
		q.mu.Lock()
		defer q.mu.Unlock()
		for _, ln := range q.fwd {
			ln.Close()
		}
	})
}
