package controlplane

import (
	"os"
	"syscall"
)

// LockFile takes an exclusive flock on path so that two test binaries (go
// test runs packages in parallel) never build the same binaries or images at
// once: the second waits, then finds the first one's result. The lock is
// released when the returned file is closed or the process dies.
func LockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
