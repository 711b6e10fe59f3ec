package sshprobe

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

func serve(t *testing.T, reply string, delay time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				time.Sleep(delay)
				c.Write([]byte(reply))
				time.Sleep(100 * time.Millisecond)
			}()
		}
	}()
	return ln.Addr().String()
}

func TestProbe(t *testing.T) {
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	closedAddr := closed.Addr().String()
	closed.Close()
	tests := []struct {
		name       string
		addr       string
		wantBanner string
		wantErr    bool
		noBanner   bool
	}{
		{"banner", serve(t, "SSH-2.0-OpenSSH_9.2\r\n", 0), "SSH-2.0-OpenSSH_9.2", false, false},
		{"banner after a pre-banner line", serve(t, "hello\r\nSSH-2.0-x\r\n", 0), "SSH-2.0-x", false, false},
		{"not SSH", serve(t, "HTTP/1.1 400\r\n\r\n\r\n\r\n\r\n\r\n", 0), "", true, true},
		{"silent listener (hung sshd) times out", serve(t, "", 2*time.Second), "", true, false},
		{"nothing listening", closedAddr, "", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, _, err := Prober{Addr: tt.addr, Timeout: 300 * time.Millisecond}.Probe(context.Background())
			if (err != nil) != tt.wantErr || b != tt.wantBanner {
				t.Fatalf("Probe() = %q,%v; want %q, error %v", b, err, tt.wantBanner, tt.wantErr)
			}
			if tt.noBanner && !errors.Is(err, ErrNoBanner) {
				t.Errorf("error = %v; want ErrNoBanner", err)
			}
		})
	}
}
