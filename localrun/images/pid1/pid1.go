// Package pid1 is what a container's only process owes the Pod it runs in
// when it stands in for someone else's image: exit 0 at SIGTERM or SIGINT,
// and reap every orphan while it is PID 1 of a shared PID namespace.
package pid1

import (
	"os"
	"os/signal"
	"syscall"
)

// Wait reaps exited children until SIGTERM or SIGINT arrives, then exits
// the process with status 0. It never returns.
func Wait() {
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
