// Command pause is the local node's sandbox ("pause") container and the
// stand-in for every container that only has to exist: the anchor Job's and
// virtsim's virt-launcher Pods. It does what registry.k8s.io/pause does —
// sleeps until SIGTERM or SIGINT and then exits 0, and reaps every orphan
// while it is PID 1 of a Pod's shared PID namespace — at the cost of one
// sleeping process.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for { // reap every exited child; none may stay a zombie
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
