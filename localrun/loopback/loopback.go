// Package loopback brings up the loopback interface of a fresh network
// namespace (the calling thread's), which starts with lo down: the guest
// VM's init and the browser harness's own namespace both need it.
package loopback

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Up sets lo up in the calling thread's network namespace.
func Up() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	return nil
}
