package node

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Pod subnets are 10.217.<i>.0/24, one per running node, on bridge
// "labkeep<i>"; the host holds 10.217.<i>.1. The range is labkeep's own
// choice, away from the usual CNI defaults (10.88/16, 10.244/16,
// 10.42/16), so a node never shadows another network on the machine.
const (
	bridgePrefix = "labkeep"
	subnetFormat = "10.217.%d.0/24"
	maxBridges   = 256
)

// bridgeNet is a node's Pod network on the host.
type bridgeNet struct {
	name, cidr, hostIP, firstPodIP string
}

// allocateBridge creates the first free labkeep<i> bridge with the host's
// address of its subnet. Several nodes (parallel test binaries) may start at
// once; an abstract unix socket serves as a machine-wide lock that leaves no
// file and dies with its holder. The bridge's alias names the owner, so a
// later sweepStale can tell a leftover from a live node's bridge.
func allocateBridge(dir string) (*bridgeNet, error) {
	unlock, err := machineLock("labkeep-node-net")
	if err != nil {
		return nil, err
	}
	defer unlock()
	for i := range maxBridges {
		name := fmt.Sprintf("%s%d", bridgePrefix, i)
		if _, err := os.Stat(filepath.Join("/sys/class/net", name)); err == nil {
			continue
		}
		b := &bridgeNet{
			name:       name,
			cidr:       fmt.Sprintf(subnetFormat, i),
			hostIP:     fmt.Sprintf("10.217.%d.1", i),
			firstPodIP: fmt.Sprintf("10.217.%d.2", i),
		}
		if err := ipCmd("link", "add", name, "type", "bridge"); err != nil {
			return nil, err
		}
		for _, args := range [][]string{
			{"link", "set", name, "alias", fmt.Sprintf("%s owner=%d dir=%s", dirPrefix, os.Getpid(), dir)},
			{"addr", "add", b.hostIP + "/24", "dev", name},
			{"link", "set", name, "up"},
		} {
			if err := ipCmd(args...); err != nil {
				_ = ipCmd("link", "del", name)
				return nil, err
			}
		}
		return b, nil
	}
	return nil, fmt.Errorf("no free %s<i> bridge name (all %d in use)", bridgePrefix, maxBridges)
}

// ports lists the interfaces (the Pods' host-side veths) on the bridge.
func (b *bridgeNet) ports() []string {
	entries, _ := os.ReadDir(filepath.Join("/sys/class/net", b.name, "brif"))
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// remove deletes the Pods' veths (their network namespaces may already be
// gone, taking them along) and the bridge.
func (b *bridgeNet) remove(veths []string) error {
	for _, v := range append(veths, b.ports()...) {
		if _, err := os.Stat(filepath.Join("/sys/class/net", v)); err == nil {
			_ = ipCmd("link", "del", v)
		}
	}
	if _, err := os.Stat(filepath.Join("/sys/class/net", b.name)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return ipCmd("link", "del", b.name)
}

var ownerRE = regexp.MustCompile(`^` + dirPrefix + ` owner=(\d+) `)

// sweepBridges deletes labkeep bridges whose owning process is gone.
func sweepBridges() {
	matches, _ := filepath.Glob("/sys/class/net/" + bridgePrefix + "*")
	for _, m := range matches {
		alias, err := os.ReadFile(filepath.Join(m, "ifalias"))
		if err != nil {
			continue
		}
		sub := ownerRE.FindSubmatch(alias)
		if sub == nil {
			continue
		}
		pid, _ := strconv.Atoi(string(sub[1]))
		if pid > 0 && pid != os.Getpid() && !processExists(pid) {
			b := &bridgeNet{name: filepath.Base(m)}
			_ = b.remove(nil)
		}
	}
}

// BridgeOf returns the bridge that the node whose temp dir is dir created,
// if it still exists, else "". A bridge is recognised by the alias naming
// its node's dir, never by its name alone: once it is gone, another node
// may take the same name.
func BridgeOf(dir string) string {
	matches, _ := filepath.Glob("/sys/class/net/" + bridgePrefix + "*")
	for _, m := range matches {
		alias, err := os.ReadFile(filepath.Join(m, "ifalias"))
		if err == nil && strings.HasSuffix(strings.TrimSpace(string(alias)), " dir="+dir) {
			return filepath.Base(m)
		}
	}
	return ""
}

func processExists(pid int) bool {
	return !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// machineLock takes a machine-wide lock named name (an abstract unix
// socket: no file, released when the holder closes it or dies), waiting
// for it as long as another process holds it.
func machineLock(name string) (unlock func(), err error) {
	for start := time.Now(); ; {
		l, err := net.Listen("unix", "@"+name)
		if err == nil {
			return func() { l.Close() }, nil
		}
		if time.Since(start) > time.Minute {
			return nil, fmt.Errorf("lock %s: %w", name, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
