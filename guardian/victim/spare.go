package victim

// SpareSmallLogins returns the unprotected processes a fork-bomb
// containment kills: every one except small login subtrees. A login
// subtree is a process whose parent is an sshd session process (the
// user's login shell) with all its descendants. One of at most maxSize
// processes is a login at work, started beside the bomb — killing it
// would fail a login in progress — while the subtree of a shell that runs
// the bomb holds hundreds. A bomb that has only just started in a login
// is small too; it is caught at a later containment round, once it grew
// past maxSize, since each round takes a fresh snapshot.
func SpareSmallLogins(procs []Process, protected Protected, maxSize int) []Process {
	children := map[int][]Process{}
	for _, p := range procs {
		children[p.PPID] = append(children[p.PPID], p)
	}
	bySessionPID := map[int]bool{}
	for _, p := range procs {
		if protected[p.Key()] == ReasonSession {
			bySessionPID[p.PID] = true
		}
	}
	spared := map[Key]bool{}
	for _, p := range procs {
		if protected.Has(p.Identity) || !bySessionPID[p.PPID] {
			continue
		}
		tree := subtree(p, children, maxSize+1)
		if len(tree) > maxSize {
			continue
		}
		for _, q := range tree {
			spared[q.Key()] = true
		}
	}
	var out []Process
	for _, p := range Unprotected(procs, protected) {
		if !spared[p.Key()] {
			out = append(out, p)
		}
	}
	return out
}

// subtree returns root and its descendants, stopping once it holds limit
// processes. A child that started before its parent is a PID reuse
// artefact and is left out.
func subtree(root Process, children map[int][]Process, limit int) []Process {
	out := []Process{root}
	for i := 0; i < len(out) && len(out) < limit; i++ {
		for _, c := range children[out[i].PID] {
			if c.StartTime >= out[i].StartTime {
				out = append(out, c)
			}
		}
	}
	return out
}
