// Command launcher is virtsim's stand-in for a virt-launcher Pod's
// container: a guest's network presence without a guest. Run with no
// arguments it does what pause does (sleeps until SIGTERM or SIGINT, exits
// 0, reaps orphans as PID 1) and also accepts TCP connections on
// GuestPorts, answering each with its host name, as services in a VM would.
// Run as "launcher probe ADDR..." (through the API server's exec, since the
// image has no shell) it tries each ADDR once and prints "ADDR open" or
// "ADDR closed" and why: the traffic a VM of the session could make, tried from the
// Pod NetworkPolicy confines. ADDR is host:port for a TCP connection,
// udp:host:port for a DNS query over UDP (open when anything answers), or
// icmp:IP for an ICMP echo over a raw socket (which needs NET_RAW, as a
// networking lab's ping does; a copy of the program probes from a
// workspace too).
//
// It stands in for the launcher only: what it shows is the network policy
// around a launcher Pod, by real traffic through the node's engine; a real
// guest behind a real virt-launcher is KubeVirt's to show.
package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"labkeep/localrun/images/pid1"
)

// GuestPorts are the TCP ports a launcher answers on: a low, a common and a
// high port, so "every port between the session's machines" is tried at
// both ends of the range and between.
var GuestPorts = []int{80, 8080, 49152}

// probeTimeout bounds each dial of probe: a policy that drops rather than
// rejects shows as a timeout.
const probeTimeout = 3 * time.Second

func main() {
	if len(os.Args) > 1 {
		if os.Args[1] != "probe" || len(os.Args) < 3 {
			fmt.Fprintln(os.Stderr, "usage: launcher [probe ADDR...]")
			os.Exit(2)
		}
		probe(os.Args[2:])
		return
	}
	name, _ := os.Hostname()
	for _, p := range GuestPorts {
		l, err := net.Listen("tcp", ":"+strconv.Itoa(p))
		if err != nil {
			fmt.Fprintf(os.Stderr, "launcher: port %d: %v\n", p, err)
			os.Exit(1)
		}
		go serve(l, name)
	}
	pid1.Wait()
}

// serve answers every connection on l with name and a newline.
func serve(l net.Listener, name string) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		_, _ = fmt.Fprintln(c, name)
		c.Close()
	}
}

// probe prints, for each address, whether a TCP connection opens, a DNS
// query is answered or an ICMP echo is answered.
func probe(addrs []string) {
	for _, a := range addrs {
		var err error
		if ip, ok := strings.CutPrefix(a, "icmp:"); ok {
			err = echo(ip)
		} else if hp, ok := strings.CutPrefix(a, "udp:"); ok {
			err = query(hp)
		} else {
			var c net.Conn
			if c, err = net.DialTimeout("tcp", a, probeTimeout); err == nil {
				c.Close()
			}
		}
		if err != nil {
			fmt.Println(a, "closed", err)
			continue
		}
		fmt.Println(a, "open")
	}
}

// echo sends one ICMP echo request to the IPv4 address ip from a raw
// socket and waits for its reply.
func echo(ip string) error {
	dst, err := net.ResolveIPAddr("ip4", ip)
	if err != nil {
		return err
	}
	c, err := net.ListenIP("ip4:icmp", nil)
	if err != nil {
		return err // EPERM without NET_RAW
	}
	defer c.Close()
	id := uint16(os.Getpid())
	req := []byte{8, 0, 0, 0, byte(id >> 8), byte(id), 0, 1, 'l', 'a', 'b', 'k'}
	sum := checksum(req)
	req[2], req[3] = byte(sum>>8), byte(sum)
	if _, err := c.WriteToIP(req, dst); err != nil {
		return err
	}
	deadline := time.Now().Add(probeTimeout)
	buf := make([]byte, 1500)
	for {
		if err := c.SetReadDeadline(deadline); err != nil {
			return err
		}
		n, from, err := c.ReadFromIP(buf)
		if err != nil {
			return err
		}
		// An echo reply (type 0) to this request, from the address asked.
		if n >= 8 && buf[0] == 0 && from.IP.Equal(dst.IP) && uint16(buf[4])<<8|uint16(buf[5]) == id {
			return nil
		}
	}
}

// query sends one DNS query (an A record of example.com) over UDP to
// hostport and waits for any datagram back: UDP has no handshake, so only
// an answer tells a reachable resolver from a dropped packet.
func query(hostport string) error {
	c, err := net.Dial("udp", hostport)
	if err != nil {
		return err
	}
	defer c.Close()
	msg := []byte{0x1a, 0xb0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, // id, RD, one question
		7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 3, 'c', 'o', 'm', 0, 0, 1, 0, 1} // example.com A IN
	if _, err := c.Write(msg); err != nil {
		return err
	}
	if err := c.SetReadDeadline(time.Now().Add(probeTimeout)); err != nil {
		return err
	}
	_, err = c.Read(make([]byte, 512))
	return err
}

// checksum is the Internet checksum (RFC 1071) of b.
func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
