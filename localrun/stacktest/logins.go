package stacktest

import (
	"fmt"
	"net"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
)

// LoginTimeout bounds a connection's set-up (TCP, handshake,
// authentication) and, for a login of LoginLoop, the whole login, on a
// node with a real CPU: a frozen or starved sshd must show as a failed
// login, not hang the test.
const LoginTimeout = 10 * time.Second

// Dial connects as user to addr with key, verifying the host key with
// hosts, within the given time (LoginTimeout on a real CPU); keepDeadline
// leaves that bound in force on the connection after the handshake,
// bounding everything done on it.
func Dial(addr, user string, key ssh.Signer, hosts ssh.HostKeyCallback, within time.Duration, keepDeadline bool) (*ssh.Client, error) {
	conn, err := net.DialTimeout("tcp", addr, within)
	if err != nil {
		return nil, err
	}
	if err := conn.SetDeadline(time.Now().Add(within)); err != nil {
		conn.Close()
		return nil, err
	}
	c, chans, reqs, err := ssh.NewClientConn(conn, addr, &ssh.ClientConfig{
		User:            user,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(key)},
		HostKeyCallback: hosts,
	})
	if err != nil {
		conn.Close()
		return nil, err
	}
	if !keepDeadline {
		if err := conn.SetDeadline(time.Time{}); err != nil {
			c.Close()
			return nil, err
		}
	}
	return ssh.NewClient(c, chans, reqs), nil
}

// Logins logs in (connect, run a command, disconnect) again and again
// until finished, counting successes and failures.
type Logins struct {
	once sync.Once
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	ok   int
	fail []string
	lat  []time.Duration
}

// LoginLoop starts logging in to addr every interval, each login bounded
// by within (LoginTimeout on a real CPU).
func LoginLoop(addr, user string, key ssh.Signer, hosts ssh.HostKeyCallback, interval, within time.Duration) *Logins {
	l := &Logins{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for {
			start := time.Now()
			err := func() error {
				c, err := Dial(addr, user, key, hosts, within, true)
				if err != nil {
					return err
				}
				defer c.Close()
				sess, err := c.NewSession()
				if err != nil {
					return err
				}
				defer sess.Close()
				return sess.Run("true")
			}()
			l.mu.Lock()
			if err != nil {
				l.fail = append(l.fail, fmt.Sprintf("%s: %v", start.Format("15:04:05.000"), err))
			} else {
				l.ok++
				l.lat = append(l.lat, time.Since(start))
			}
			l.mu.Unlock()
			select {
			case <-l.stop:
				return
			case <-time.After(interval):
			}
		}
	}()
	return l
}

// Finish stops the loop and returns the successes, failures and the
// slowest login. It may be called again (a test's clean-up stopping a loop
// its failure left running).
func (l *Logins) Finish() (ok int, fail []string, slowest time.Duration) {
	l.once.Do(func() { close(l.stop) })
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, d := range l.lat {
		slowest = max(slowest, d)
	}
	return l.ok, l.fail, slowest
}
