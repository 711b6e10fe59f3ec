package victim

// Reason says why a process is protected; it appears in alerts, logs and
// the /alerts API so an operator can see what guardian refused to kill.
type Reason string

// The reasons a process can be protected.
const (
	ReasonPID1       Reason = "pid1"           // PID 1 of the PID namespace
	ReasonInit       Reason = "container-init" // the workspace container's first process: the container exits when it dies
	ReasonListener   Reason = "sshd-listener"  // the process holding the SSH listening socket
	ReasonSession    Reason = "sshd-session"   // sshd processes serving a live connection
	ReasonSelf       Reason = "guardian"       // guardian itself
	ReasonConfigured Reason = "configured"     // an executable the operator listed
)

// Protected maps the (PID, start time) of each protected process to why it is
// protected. The zero value protects nothing.
type Protected map[Key]Reason

// Has reports whether the process with this identity is protected.
func (p Protected) Has(id Identity) bool {
	_, ok := p[id.Key()]
	return ok
}

// Rules is what the protected set is computed from. Names (comm) play no
// part: a user process renamed "sshd" or "guardian" stays unprotected.
type Rules struct {
	// ProtectPID1 protects the process whose PID is 1.
	ProtectPID1 bool
	// ProtectInit protects the oldest process of the snapshot, the workspace
	// container's entrypoint: when it dies the container exits.
	ProtectInit bool
	// Listener is the process holding the SSH listening socket, found by the
	// socket inode, not by name. A zero PID means none was found.
	Listener Identity
	// SessionExes are executables sshd runs for each connection (the
	// listener's own executable is always included), for example
	// /usr/lib/openssh/sshd-session on OpenSSH >= 9.8.
	SessionExes []string
	// SessionDepth is how many generations below the listener count as sshd
	// connection processes (2 for OpenSSH: the privileged monitor and the
	// unprivileged child). The user's shell and everything it starts lie
	// deeper or run another executable and stay unprotected.
	SessionDepth int
	// Self is guardian's own process.
	Self Key
	// Exes are operator-configured executables (resolved paths) whose
	// processes are protected.
	Exes []string
}

// Protect computes the protected set of a process snapshot.
func Protect(procs []Process, r Rules) Protected {
	out := Protected{}
	byPID := make(map[int]Process, len(procs))
	children := make(map[int][]Process)
	var oldest *Process
	for i, p := range procs {
		byPID[p.PID] = p
		children[p.PPID] = append(children[p.PPID], p)
		if oldest == nil || p.StartTime < oldest.StartTime || (p.StartTime == oldest.StartTime && p.PID < oldest.PID) {
			oldest = &procs[i]
		}
	}
	configured := set(r.Exes)
	for _, p := range procs {
		switch {
		case p.Key() == r.Self:
			out[p.Key()] = ReasonSelf
		case r.ProtectPID1 && p.PID == 1:
			out[p.Key()] = ReasonPID1
		case p.Exe != "" && configured[p.Exe]:
			out[p.Key()] = ReasonConfigured
		}
	}
	if r.ProtectInit && oldest != nil {
		if _, done := out[oldest.Key()]; !done {
			out[oldest.Key()] = ReasonInit
		}
	}
	if r.Listener.PID == 0 {
		return out
	}
	l, ok := byPID[r.Listener.PID]
	if !ok || l.StartTime != r.Listener.StartTime || l.Exe != r.Listener.Exe {
		return out
	}
	out[l.Key()] = ReasonListener
	sessionExes := set(r.SessionExes)
	sessionExes[l.Exe] = true
	depth := r.SessionDepth
	if depth <= 0 {
		depth = 2
	}
	level := []Process{l}
	for d := 0; d < depth; d++ {
		var next []Process
		for _, parent := range level {
			for _, c := range children[parent.PID] {
				// A child started before its parent is a PID reuse artefact, not a child.
				if c.StartTime < parent.StartTime || !sessionExes[c.Exe] {
					continue
				}
				if _, done := out[c.Key()]; !done {
					out[c.Key()] = ReasonSession
				}
				next = append(next, c)
			}
		}
		level = next
	}
	return out
}

func set(xs []string) map[string]bool {
	m := make(map[string]bool, len(xs))
	for _, x := range xs {
		if x != "" {
			m[x] = true
		}
	}
	return m
}
