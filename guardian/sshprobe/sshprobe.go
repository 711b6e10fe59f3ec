// Package sshprobe checks that SSH is reachable the way a user reaches it:
// a TCP connection that yields an SSH protocol banner ("SSH-2.0-...") within
// a timeout. A listening socket alone proves nothing when sshd is starved
// of CPU or frozen.
package sshprobe

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// ErrNoBanner is returned when the peer answered with something other than
// an SSH banner.
var ErrNoBanner = errors.New("no SSH banner")

// Prober probes one address.
type Prober struct {
	Addr    string        // host:port
	Timeout time.Duration // for connect plus banner
}

// Probe connects and reads the banner. It returns the banner and how long
// it took, or an error (connection refused, timeout, ErrNoBanner).
func (p Prober) Probe(ctx context.Context) (banner string, took time.Duration, err error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, p.Timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", p.Addr)
	if err != nil {
		return "", time.Since(start), fmt.Errorf("ssh probe %s: %w", p.Addr, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	// RFC 4253: the server may send other lines before the version string.
	r := bufio.NewReaderSize(conn, 512)
	for i := 0; i < 5; i++ {
		line, err := r.ReadString('\n')
		if err != nil {
			return "", time.Since(start), fmt.Errorf("ssh probe %s: %w", p.Addr, err)
		}
		if strings.HasPrefix(line, "SSH-") {
			// Identify ourselves before hanging up, so sshd logs an
			// ordinary pre-auth disconnect rather than a protocol error
			// every probe period.
			conn.Write([]byte("SSH-2.0-labkeep-guardian-probe\r\n"))
			return strings.TrimSpace(line), time.Since(start), nil
		}
	}
	return "", time.Since(start), fmt.Errorf("ssh probe %s: %w", p.Addr, ErrNoBanner)
}
