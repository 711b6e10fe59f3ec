package node

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// apiForward makes the API server, which listens on the host's loopback,
// reachable inside the node's network namespace: at the same address, so
// the node's processes use the control plane's kubeconfigs unchanged (the
// server's certificate, issued for 127.0.0.1, verifies), and on the Pods'
// gateway, where the default/kubernetes Service sends in-cluster clients
// (the certificate holds the Service's ClusterIP). It is a plain TCP relay:
// TLS runs end to end between the client and the API server.
type apiForward struct {
	ls []net.Listener
	wg sync.WaitGroup
}

// forwardAPI listens on each of listen (host:port) in the network
// namespace of process pid and relays every connection to target on the
// host.
func forwardAPI(pid int, target string, listen ...string) (*apiForward, error) {
	f := &apiForward{}
	for _, addr := range listen {
		l, err := listenIn(pid, addr)
		if err != nil {
			f.close()
			return nil, fmt.Errorf("relay to the API server in the node's network namespace: %w", err)
		}
		f.ls = append(f.ls, l)
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go relay(c, target)
			}
		}()
	}
	return f, nil
}

// relay copies between c and a new connection to addr until either side
// closes.
func relay(c net.Conn, addr string) {
	defer c.Close()
	u, err := net.Dial("tcp", addr)
	if err != nil {
		return
	}
	defer u.Close()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(u, c)
		_ = u.(*net.TCPConn).CloseWrite()
		close(done)
	}()
	_, _ = io.Copy(c, u)
	_ = c.(*net.TCPConn).CloseWrite()
	<-done
}

// close stops accepting; open relays end when their peers close (the
// node's processes are stopped first).
func (f *apiForward) close() {
	if f == nil {
		return
	}
	for _, l := range f.ls {
		_ = l.Close()
	}
	f.wg.Wait()
}

// listenIn opens a TCP listener in the network namespace of process pid.
func listenIn(pid int, addr string) (net.Listener, error) {
	return openIn(netnsPath(pid), func() (net.Listener, error) { return net.Listen("tcp", addr) })
}

// openIn runs open (which makes a socket) in the network namespace whose
// file is nsFile (a process's /proc/<pid>/ns/net, or a bind mount of one).
// A socket belongs to the namespace of the thread that made
// it, so a locked OS thread enters the namespace, opens and returns; if it
// cannot return, the thread is left locked and dies with its goroutine, so
// no other goroutine ever runs in the node's namespace.
func openIn[T io.Closer](nsFile string, open func() (T, error)) (T, error) {
	type result struct {
		s   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		var zero T
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{zero, err}
			return
		}
		defer self.Close()
		target, err := os.Open(nsFile)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{zero, err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{zero, fmt.Errorf("enter: %w", err)}
			return
		}
		s, err := open()
		if back := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); back != nil {
			if err == nil {
				s.Close()
			}
			ch <- result{zero, errors.Join(err, fmt.Errorf("return to the host's namespace: %w", back))}
			return // the thread stays locked and ends with this goroutine
		}
		runtime.UnlockOSThread()
		ch <- result{s, err}
	}()
	r := <-ch
	return r.s, r.err
}
