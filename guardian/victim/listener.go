package victim

import "fmt"

// FileID names one file for as long as it exists: the device and inode
// that stat(2) reports. Unlike a path, it changes when the file at the
// path is replaced, so a user who swaps the sshd binary gets a new one.
// The zero value means unknown.
type FileID struct {
	Dev uint64 `json:"dev"`
	Ino uint64 `json:"ino"`
}

// Known reports whether the identity was read.
func (f FileID) Known() bool { return f.Ino != 0 }

// String renders the identity as dev:ino for alerts and logs.
func (f FileID) String() string { return fmt.Sprintf("%d:%d", f.Dev, f.Ino) }

// Executable is the executable file a process runs: its path (as
// /proc/PID/exe names it, for people) and its file identity (what counts).
type Executable struct {
	Path string `json:"path"`
	File FileID `json:"file"`
}

// String renders the executable for alerts and logs.
func (e Executable) String() string { return fmt.Sprintf("%s (%s)", e.Path, e.File) }

// SSHDTrust is what the holder of the SSH listening socket is checked
// against before it gets the listener's protection (real-time scheduling,
// oom_score_adj -1000, immunity from kills). Holding the port proves
// nothing: the workspace's root can kill sshd and bind the port itself,
// or replace the sshd binary and make sshd re-execute it.
type SSHDTrust struct {
	// Want is the workspace's sshd executable: the one the first listener
	// found in the guarded cgroup ran, or the configured path resolved in
	// the container's root. A zero File means none is known yet.
	Want Executable
	// Configured says Want comes from the operator's configuration: then
	// a holder is never recorded as the sshd, and while the configured
	// file cannot be found nothing qualifies.
	Configured bool
}

// ListenerVerdict is the outcome of CheckListener.
type ListenerVerdict struct {
	// Qualifies says the holder is the workspace's sshd and gets the
	// listener's protection.
	Qualifies bool
	// Record says the holder's executable becomes Want from now on (the
	// first listener of the guarded cgroup, nothing configured).
	Record bool
	// Why explains a refusal, for the alert naming the holder.
	Why string
}

// CheckListener decides whether a process that holds the SSH listening
// socket and runs exe is the workspace's sshd. It qualifies when its
// executable is the same file (device and inode) as trust.Want; when
// nothing is known yet and nothing is configured, the first holder
// qualifies and its executable is recorded. A process whose executable
// cannot be identified never qualifies.
func CheckListener(exe Executable, trust SSHDTrust) ListenerVerdict {
	switch {
	case !exe.File.Known():
		return ListenerVerdict{Why: fmt.Sprintf("its executable %q cannot be identified", exe.Path)}
	case trust.Want.File.Known() && exe.File == trust.Want.File:
		return ListenerVerdict{Qualifies: true}
	case trust.Want.File.Known() && trust.Configured:
		return ListenerVerdict{Why: fmt.Sprintf("it runs %s, not the configured sshd %s", exe, trust.Want)}
	case trust.Want.File.Known():
		return ListenerVerdict{Why: fmt.Sprintf("it runs %s, not %s, the sshd the workspace started with", exe, trust.Want)}
	case trust.Configured:
		return ListenerVerdict{Why: fmt.Sprintf("the configured sshd %q was not found in the container", trust.Want.Path)}
	default:
		return ListenerVerdict{Qualifies: true, Record: true}
	}
}
