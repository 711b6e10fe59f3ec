package guestnode

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"labkeep/localrun/guestvm"
	"labkeep/localrun/node"
)

// link is the guest's network as the host sees it.
type link struct {
	tap     string // the host's end (qemu creates and removes it)
	hostIP  string // the host's address on it (/30)
	guestIP string // the guest's, its kubelet's InternalIP
	podCIDR string // the guest's Pods, routed through guestIP
}

// maxLinks bounds how many guest nodes one machine runs at once.
const maxLinks = 16

// allocateLink picks the first tap name not in use. Its addresses follow
// from its number and lie beside the local node's (10.216/10.217). The
// name is taken only once qemu has made the tap: the caller holds the
// returned lock (machine-wide) until then.
func allocateLink() (link, func(), error) {
	unlock, err := node.MachineLock("labkeep-guestnode-link")
	if err != nil {
		return link{}, nil, err
	}
	for i := range maxLinks {
		tap := fmt.Sprintf("lkv%d", i)
		if _, err := os.Stat(filepath.Join("/sys/class/net", tap)); err == nil {
			continue
		}
		return link{
			tap:     tap,
			hostIP:  fmt.Sprintf("10.218.%d.1", i),
			guestIP: fmt.Sprintf("10.218.%d.2", i),
			podCIDR: fmt.Sprintf("10.219.%d.0/24", i),
		}, unlock, nil
	}
	unlock()
	return link{}, nil, fmt.Errorf("no free lkv<i> tap name (all %d in use)", maxLinks)
}

// configureHost waits for qemu's tap, gives the host its address there and
// routes the guest's Pods through the guest.
func (l link) configureHost(ctx context.Context, g *guestvm.Guest) error {
	for {
		if _, err := os.Stat(filepath.Join("/sys/class/net", l.tap)); err == nil {
			break
		}
		if g.Exited() {
			return fmt.Errorf("qemu ended before its tap %s appeared", l.tap)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("tap %s: %w", l.tap, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	for _, args := range [][]string{
		{"addr", "add", l.hostIP + "/30", "dev", l.tap},
		{"link", "set", l.tap, "up"},
		{"route", "add", l.podCIDR, "via", l.guestIP, "dev", l.tap},
	} {
		if out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// forward accepts connections on addr and copies each to and from a new
// connection to target, until the listener is closed.
func forward(addr, target string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.DialTimeout("tcp", target, 5*time.Second)
				if err != nil {
					return
				}
				defer u.Close()
				done := make(chan struct{}, 2)
				go func() { io.Copy(u, c); done <- struct{}{} }()
				go func() { io.Copy(c, u); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	return l, nil
}
