// Package killer signals processes through pidfds after re-checking their
// identity, so that a PID reused between the decision and the signal can
// never make guardian hit the wrong process.
package killer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"labkeep/guardian/victim"
)

// ErrIdentityChanged is returned when the PID now names another process
// (different start time, executable or cgroup) than the one decided on.
var ErrIdentityChanged = errors.New("process identity changed")

// ErrGone is returned when the process already exited.
var ErrGone = errors.New("process gone")

// IdentityReader re-reads a process identity from /proc.
type IdentityReader interface {
	// Identity returns the current identity of pid, or an error wrapping a
	// "gone" error when it exited.
	Identity(pid int) (victim.Identity, error)
}

// Killer sends signals through pidfds.
type Killer struct {
	Procs IdentityReader
	// Gone reports whether an error from Procs means the process exited.
	Gone func(error) bool
}

// open pins the process behind id: pidfd first, then the identity check.
// If the identity matches after the pidfd was opened, the pidfd refers to
// that very process (had it died and the PID been reused before the open,
// the check would see the newcomer's start time).
func (k *Killer) open(id victim.Identity) (int, error) {
	fd, err := unix.PidfdOpen(id.PID, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return -1, fmt.Errorf("%v: %w", id, ErrGone)
		}
		return -1, fmt.Errorf("pidfd_open %d: %w", id.PID, err)
	}
	cur, err := k.Procs.Identity(id.PID)
	if err != nil {
		unix.Close(fd)
		if k.Gone != nil && k.Gone(err) {
			return -1, fmt.Errorf("%v: %w", id, ErrGone)
		}
		return -1, err
	}
	if cur != id {
		unix.Close(fd)
		return -1, fmt.Errorf("%v is now %v: %w", id, cur, ErrIdentityChanged)
	}
	return fd, nil
}

// Signal sends sig to the process if it is still the one identified.
func (k *Killer) Signal(id victim.Identity, sig unix.Signal) error {
	fd, err := k.open(id)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return send(fd, id, sig)
}

func send(fd int, id victim.Identity, sig unix.Signal) error {
	if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("%v: %w", id, ErrGone)
		}
		return fmt.Errorf("signal %v to %v: %w", sig, id, err)
	}
	return nil
}

// Terminate sends SIGTERM, waits up to grace for the process to exit, then
// sends SIGKILL and waits up to killWait. grace 0 sends SIGKILL at once (at
// the hard memory limit a process may not run its SIGTERM handler). It
// returns when the process exited, reporting whether SIGKILL was needed;
// ErrGone if it had already exited. hurry, if not nil, is polled during the
// grace period: when it turns true (the workspace reached its hard memory
// limit meanwhile) SIGKILL follows at once.
func (k *Killer) Terminate(ctx context.Context, id victim.Identity, grace, killWait time.Duration, hurry func() bool) (killed bool, err error) {
	fd, err := k.open(id)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	if grace > 0 {
		if err := send(fd, id, unix.SIGTERM); err != nil {
			return false, err
		}
		if exited(ctx, fd, grace, hurry) {
			return false, nil
		}
	}
	if err := send(fd, id, unix.SIGKILL); err != nil {
		if errors.Is(err, ErrGone) {
			return false, nil // exited between the wait and SIGKILL
		}
		return false, err
	}
	if !exited(ctx, fd, killWait, nil) {
		return true, fmt.Errorf("%v still alive %v after SIGKILL", id, killWait)
	}
	return true, nil
}

// exited waits until the pidfd reports the process exited; it gives up
// early (false) when hurry turns true.
func exited(ctx context.Context, fd int, d time.Duration, hurry func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil || (hurry != nil && hurry()) {
			return false
		}
		step := min(left, 50*time.Millisecond)
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, int(step.Milliseconds())+1)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return false
		}
		if n > 0 && pfd[0].Revents != 0 {
			return true
		}
	}
}
