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

// ErrGone is returned when the process already exited (victim.ErrGone).
var ErrGone = victim.ErrGone

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

// target is a process pinned by a pidfd after its identity was checked:
// whatever happens to the PID afterwards, signals reach this process or
// nobody.
type target struct {
	fd int
	id victim.Identity
}

func (k *Killer) pin(id victim.Identity) (*target, error) {
	fd, err := k.open(id)
	if err != nil {
		return nil, err
	}
	return &target{fd: fd, id: id}, nil
}

func (t *target) signal(sig unix.Signal) error {
	if err := unix.PidfdSendSignal(t.fd, sig, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("%v: %w", t.id, ErrGone)
		}
		return fmt.Errorf("signal %v to %v: %w", sig, t.id, err)
	}
	return nil
}

// Signal sends sig to the process if it is still the one identified.
func (k *Killer) Signal(id victim.Identity, sig unix.Signal) error {
	t, err := k.pin(id)
	if err != nil {
		return err
	}
	defer unix.Close(t.fd)
	return t.signal(sig)
}

// Plan says how Terminate proceeds.
type Plan struct {
	// Grace is how long the process has to exit after SIGTERM before
	// SIGKILL. 0 sends SIGKILL at once (at the hard memory limit a process
	// may not get to run its SIGTERM handler).
	Grace time.Duration
	// KillWait is how long to wait for the exit after SIGKILL.
	KillWait time.Duration
	// Hurry, if set, is polled during the grace period: when it turns true
	// (the workspace reached its hard memory limit meanwhile) SIGKILL
	// follows at once.
	Hurry func() bool
	// AfterFirstSignal, if set, runs right after the first signal went out:
	// guardian signals while the cgroup is frozen (identity checked on a
	// still process) and thaws here so the signal takes effect.
	AfterFirstSignal func()
}

// Terminate pins the process (identity checked once, through a pidfd, so
// no later PID reuse matters), sends SIGTERM (SIGKILL when Grace is 0),
// waits Grace, then SIGKILL and waits KillWait. It reports whether SIGKILL
// was sent; ErrGone if the process had already exited, ErrIdentityChanged
// if the PID names another process, an error if it survived SIGKILL.
func (k *Killer) Terminate(ctx context.Context, id victim.Identity, p Plan) (killed bool, err error) {
	t, err := k.pin(id)
	if err != nil {
		if p.AfterFirstSignal != nil {
			p.AfterFirstSignal()
		}
		return false, err
	}
	defer unix.Close(t.fd)
	first := unix.SIGTERM
	if p.Grace <= 0 {
		first = unix.SIGKILL
	}
	err = t.signal(first)
	if p.AfterFirstSignal != nil {
		p.AfterFirstSignal()
	}
	if err != nil {
		return false, err
	}
	if first == unix.SIGTERM {
		if exited(ctx, t.fd, p.Grace, p.Hurry) {
			return false, nil
		}
		if err := t.signal(unix.SIGKILL); err != nil {
			if errors.Is(err, ErrGone) {
				return false, nil // exited between the wait and SIGKILL
			}
			return false, err
		}
	}
	if !exited(ctx, t.fd, p.KillWait, nil) {
		return true, fmt.Errorf("%v still alive %v after SIGKILL", id, p.KillWait)
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
