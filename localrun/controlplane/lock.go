package controlplane

import (
	"os"
	"syscall"
)

// lockFile takes an exclusive flock on path so that two test binaries (go test
// runs packages in parallel) never build the same binaries at once. The lock
// is released when the returned file is closed or the process dies.
func lockFile(path string) (*os.File, error) {
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
