package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Every node is a machine of its own on the network: its kubelet, its
// Service proxy and its NetworkPolicy engine run in a network namespace of
// the node's own (containerd's, see startContainerd), so two nodes on one
// host (parallel test binaries) never share iptables rules, ipsets or
// conntrack entries. The node's namespace holds the Pods' bridge and one end
// of a veth pair; the other end, on the host, is named labkeep<i>:
//
//	host  labkeep<i> 10.216.<i>.1/30  ── veth ──  eth0 10.216.<i>.2/30  node
//	host  route 10.217.<i>.0/24 via 10.216.<i>.2      bridge lkbr 10.217.<i>.1/24
//	                                                   Pods 10.217.<i>.2 and up
//
// The host reaches every Pod through the node (students' SSH, the
// platform's calls); Pods have a default route to the bridge address, and
// the node routes nothing but its own link and its Pods, so no Pod traffic
// leaves the machine and none is masqueraded. The ranges are labkeep's own
// choice, away from the usual CNI defaults (10.88/16, 10.244/16, 10.42/16).
const (
	hostPrefix = "labkeep" // the host end of a node's veth pair
	podBridge  = "lkbr"    // the Pods' bridge, inside the node's namespace
	nodeLink   = "eth0"    // the node's end of the veth pair
	maxNodes   = 256
)

// nodeNet is a node's network: its namespace's addresses and the host end
// of its link.
type nodeNet struct {
	// name is the host end of the veth pair (labkeep<i>); peer is the
	// other end's name while it is still on the host.
	name, peer string
	// cidr is the Pods' subnet, gateway the bridge's address in it (the
	// Pods' default route) and firstPodIP the first address handed out.
	cidr, gateway, firstPodIP string
	// hostIP is the host's end of the link, nodeIP the node's: the
	// kubelet's address and the node's InternalIP.
	hostIP, nodeIP string
}

// allocateNet creates the first free labkeep<i> veth pair, its host end
// addressed and up, its peer left on the host until moved into the node's
// namespace (join). Several nodes (parallel test binaries) may start at
// once; an abstract unix socket serves as a machine-wide lock that leaves
// no file and dies with its holder. The host end's alias names the owner,
// so a later sweepStale can tell a leftover from a live node's link.
func allocateNet(dir string) (*nodeNet, error) {
	unlock, err := MachineLock("labkeep-node-net")
	if err != nil {
		return nil, err
	}
	defer unlock()
	for i := range maxNodes {
		name := fmt.Sprintf("%s%d", hostPrefix, i)
		if _, err := os.Stat(filepath.Join("/sys/class/net", name)); err == nil {
			continue
		}
		nn := &nodeNet{
			name:       name,
			peer:       fmt.Sprintf("lkn%d", i),
			cidr:       fmt.Sprintf("10.217.%d.0/24", i),
			gateway:    fmt.Sprintf("10.217.%d.1", i),
			firstPodIP: fmt.Sprintf("10.217.%d.2", i),
			hostIP:     fmt.Sprintf("10.216.%d.1", i),
			nodeIP:     fmt.Sprintf("10.216.%d.2", i),
		}
		_ = ipCmd("link", "del", nn.peer) // a leftover of a start killed mid-way
		if err := ipCmd("link", "add", name, "type", "veth", "peer", "name", nn.peer); err != nil {
			return nil, err
		}
		for _, args := range [][]string{
			{"link", "set", name, "alias", fmt.Sprintf("%s owner=%d dir=%s", dirPrefix, os.Getpid(), dir)},
			{"addr", "add", nn.hostIP + "/30", "dev", name},
			{"link", "set", name, "up"},
		} {
			if err := ipCmd(args...); err != nil {
				_ = ipCmd("link", "del", name)
				return nil, err
			}
		}
		return nn, nil
	}
	return nil, fmt.Errorf("no free %s<i> link name (all %d in use)", hostPrefix, maxNodes)
}

// join moves the peer into the network namespace of process pid (the
// node's) and sets the node up there: loopback, its link, the Pods'
// bridge, forwarding and bridge netfilter (NetworkPolicy engines filter
// bridged Pod-to-Pod traffic in iptables); then the host's route to the
// Pods.
func (nn *nodeNet) join(pid int) error {
	if err := ipCmd("link", "set", nn.peer, "netns", strconv.Itoa(pid)); err != nil {
		return err
	}
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "set", nn.peer, "name", nodeLink},
		{"addr", "add", nn.nodeIP + "/30", "dev", nodeLink},
		{"link", "set", nodeLink, "up"},
		{"link", "add", podBridge, "type", "bridge"},
		{"addr", "add", nn.gateway + "/24", "dev", podBridge},
		{"link", "set", podBridge, "up"},
	} {
		if err := inNetns(pid, "ip", args...); err != nil {
			return err
		}
	}
	for key, v := range map[string]string{"net/ipv4/ip_forward": "1", "net/bridge/bridge-nf-call-iptables": "1"} {
		if err := inNetns(pid, "sh", "-c", fmt.Sprintf("echo %s > /proc/sys/%s", v, key)); err != nil {
			return err
		}
	}
	return ipCmd("route", "add", nn.cidr, "via", nn.nodeIP, "dev", nn.name)
}

// waitOwnNetns waits until process pid is in a network namespace other
// than this process's: unshare creates it only once it runs, and a link
// moved to pid's namespace before that lands back on the host.
func waitOwnNetns(ctx context.Context, pid int) error {
	self, err := os.Readlink(netnsPath(os.Getpid()))
	if err != nil {
		return err
	}
	for {
		ns, err := os.Readlink(netnsPath(pid))
		if err != nil {
			return err // the process is gone
		}
		if ns != self {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// netnsPath is the network namespace of process pid.
func netnsPath(pid int) string { return nsPath(pid, "net") }

// nsPath is the file of process pid's namespace of the kind ("net",
// "mnt", "pid_for_children": the PID namespace of its children, which for
// unshare is the one it made).
func nsPath(pid int, kind string) string { return fmt.Sprintf("/proc/%d/ns/%s", pid, kind) }

// inNetns runs a command in the network namespace of process pid.
func inNetns(pid int, cmd string, args ...string) error {
	all := append([]string{"--net=" + netnsPath(pid), "--", cmd}, args...)
	out, err := exec.Command("nsenter", all...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("in the node's network namespace, %s %s: %w: %s", cmd, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// podLinks lists the interfaces on the Pods' bridge (the Pods' node-side
// veths) in the network namespace of process pid, the node's.
func (nn *nodeNet) podLinks(pid int) ([]string, error) {
	out, err := exec.Command("nsenter", "--net="+netnsPath(pid), "--", "ip", "-o", "link", "show", "master", podBridge).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("links on %s: %w: %s", podBridge, err, strings.TrimSpace(string(out)))
	}
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		// "7: vethab12@if2: <...>"
		if f := strings.Fields(line); len(f) > 1 {
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			names = append(names, name)
		}
	}
	return names, nil
}

// remove deletes the host's end of the link (the node's end goes with it)
// and the peer if it never left the host. Everything else of the node's
// network (its bridge, the Pods' veths, its iptables rules and ipsets) is
// in the node's namespace and went with containerd.
func (nn *nodeNet) remove() error {
	var errs []error
	for _, l := range []string{nn.name, nn.peer} {
		if l == "" {
			continue
		}
		// The kernel deletes the pair on its own once the node's namespace
		// is gone, at any moment: a link that is gone after a failed
		// delete is what was wanted.
		if err := ipCmd("link", "del", l); err != nil {
			if _, gone := os.Stat(filepath.Join("/sys/class/net", l)); !errors.Is(gone, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

var ownerRE = regexp.MustCompile(`^` + dirPrefix + ` owner=(\d+) `)

// sweepLinks deletes the labkeep<i> links whose owning process is gone.
func sweepLinks() {
	matches, _ := filepath.Glob("/sys/class/net/" + hostPrefix + "*")
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
			nn := &nodeNet{name: filepath.Base(m)}
			_ = nn.remove()
		}
	}
}

// LinkOf returns the host's end of the link that the node whose temp dir
// is dir created, if it still exists, else "". A link is recognised by the
// alias naming its node's dir, never by its name alone: once it is gone,
// another node may take the same name.
func LinkOf(dir string) string {
	matches, _ := filepath.Glob("/sys/class/net/" + hostPrefix + "*")
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

// MachineLock takes a machine-wide lock named name (an abstract unix
// socket: no file, released when the holder closes it or dies), waiting
// for it (up to a minute) as long as another process holds it.
func MachineLock(name string) (unlock func(), err error) {
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

// Listen opens a TCP listener at addr in the node's network namespace: a
// service on the node itself, as Pods see it (on n.IP, the Pods' gateway,
// or an address AddLocalAddress added).
func (n *Node) Listen(addr string) (net.Listener, error) { return listenIn(n.netPid, addr) }

// ListenPacket opens a UDP socket at addr in the node's network namespace,
// as Listen does for TCP.
func (n *Node) ListenPacket(addr string) (net.PacketConn, error) {
	return openIn(netnsPath(n.netPid), func() (net.PacketConn, error) { return net.ListenPacket("udp", addr) })
}

// AddLocalAddress gives the node one more address of its own (a /32 or
// /128 on its loopback), which its Pods route to through the node: a
// stand-in for something a node reaches that is not a Pod, like a cloud's
// metadata service at 169.254.169.254.
func (n *Node) AddLocalAddress(ip string) error {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return err
	}
	return inNetns(n.netPid, "ip", "addr", "add", netip.PrefixFrom(a, a.BitLen()).String(), "dev", "lo")
}
