package httpapi

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// ServerConfig bounds what clients can hold of guardian, whose memory
// limit (128 Mi) is small: every open connection costs a goroutine and its
// buffers, and root in the workspace shares the Pod's network namespace,
// so it can open as many as it likes.
type ServerConfig struct {
	// ReadHeaderTimeout closes a connection whose request headers have not
	// arrived in time (slowloris).
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request.
	ReadTimeout time.Duration
	// WriteTimeout bounds a request from the end of its headers to the
	// end of the response; it must leave room for POST /cleanup, which
	// freezes, kills with a grace period and thaws.
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection with no request for
	// that long.
	IdleTimeout time.Duration
	// MaxConns caps the connections served at once; further ones wait in
	// the kernel's accept queue until one closes.
	MaxConns int
}

// Defaults returns the standard bounds: headers within 5 s, a request
// read within 10 s, a response within 60 s, idle keep-alive connections
// closed after 30 s, at most 32 connections (probes, a Prometheus scrape
// and the platform's calls need a handful).
func Defaults() ServerConfig {
	return ServerConfig{ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: time.Minute, IdleTimeout: 30 * time.Second, MaxConns: 32}
}

// Validate rejects bounds that would leave a connection unbounded.
func (c ServerConfig) Validate() error {
	var errs []error
	for name, d := range map[string]time.Duration{"HTTP read header timeout": c.ReadHeaderTimeout,
		"HTTP read timeout": c.ReadTimeout, "HTTP write timeout": c.WriteTimeout, "HTTP idle timeout": c.IdleTimeout} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %v", name, d))
		}
	}
	if c.MaxConns <= 0 {
		errs = append(errs, fmt.Errorf("HTTP max connections must be positive, got %d", c.MaxConns))
	}
	return errors.Join(errs...)
}

// NewServer returns an http.Server for h with c's timeouts. Serve it on
// c.Listener(ln) so that the connection cap applies.
func (c ServerConfig) NewServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: c.ReadHeaderTimeout, ReadTimeout: c.ReadTimeout,
		WriteTimeout: c.WriteTimeout, IdleTimeout: c.IdleTimeout}
}

// Listener wraps ln so that at most c.MaxConns accepted connections are
// open at once: Accept waits for one to close before taking the next from
// the kernel's queue.
func (c ServerConfig) Listener(ln net.Listener) net.Listener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, c.MaxConns), done: make(chan struct{})}
}

type limitListener struct {
	net.Listener
	slots chan struct{} // one token per open connection
	done  chan struct{}
	once  sync.Once
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	conn, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitConn{Conn: conn, release: sync.OnceFunc(func() { <-l.slots })}, nil
}

// Close also ends an Accept waiting for a free slot.
func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	release func()
}

func (c *limitConn) Close() error {
	c.release()
	return c.Conn.Close()
}
