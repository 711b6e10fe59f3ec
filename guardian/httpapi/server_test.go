package httpapi

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// serve runs the API with c on a loopback port and returns its address.
func serve(t *testing.T, c ServerConfig) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := c.NewServer(New(&backend{}, "", prometheus.NewRegistry(), nil))
	go srv.Serve(c.Listener(ln))
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// get sends GET /livez on a keep-alive connection and reads the response.
func get(t *testing.T, conn net.Conn, r *bufio.Reader) error {
	t.Helper()
	if _, err := io.WriteString(conn, "GET /livez HTTP/1.1\r\nHost: guardian\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /livez = %s; want 200", resp.Status)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, bufio.NewReader(conn)
}

// A keep-alive connection left idle is closed by guardian after the idle
// timeout; without one it would stay open for good.
func TestIdleKeepAliveConnectionIsClosed(t *testing.T) {
	c := Defaults()
	c.IdleTimeout = 200 * time.Millisecond
	addr := serve(t, c)
	conn, r := dial(t, addr)
	if err := get(t, conn, r); err != nil {
		t.Fatal(err)
	}
	// Far beyond the idle timeout: a read that runs into this deadline
	// means the server kept the connection.
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := r.ReadByte()
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the idle keep-alive connection was still open after 10s")
	}
	if !errors.Is(err, io.EOF) {
		t.Fatalf("read on the idle connection = %v; want EOF (closed by the server)", err)
	}
}

// Connections beyond MaxConns wait in the accept queue and are served as
// soon as one of the open ones closes.
func TestConnectionsBeyondTheCapWait(t *testing.T) {
	c := Defaults()
	c.MaxConns = 2
	addr := serve(t, c)
	var held []net.Conn
	for range c.MaxConns {
		conn, r := dial(t, addr)
		if err := get(t, conn, r); err != nil {
			t.Fatal(err)
		}
		held = append(held, conn)
	}
	conn, r := dial(t, addr) // the kernel completes the handshake; guardian does not accept it yet
	io.WriteString(conn, "GET /livez HTTP/1.1\r\nHost: guardian\r\n\r\n")
	conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := r.ReadByte(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a connection beyond the cap of %d was served (read: %v); want it to wait", c.MaxConns, err)
	}
	held[0].Close()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatalf("the waiting connection was not served after one closed: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /livez = %s; want 200", resp.Status)
	}
}

func TestServerConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*ServerConfig)
		wantErr bool
	}{
		{"defaults", func(*ServerConfig) {}, false},
		{"no idle timeout", func(c *ServerConfig) { c.IdleTimeout = 0 }, true},
		{"no read header timeout", func(c *ServerConfig) { c.ReadHeaderTimeout = 0 }, true},
		{"negative write timeout", func(c *ServerConfig) { c.WriteTimeout = -time.Second }, true},
		{"no connection cap", func(c *ServerConfig) { c.MaxConns = 0 }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Defaults()
			tt.mutate(&c)
			if err := c.Validate(); (err != nil) != tt.wantErr {
				t.Errorf("Validate() = %v; want error %v", err, tt.wantErr)
			}
		})
	}
}
