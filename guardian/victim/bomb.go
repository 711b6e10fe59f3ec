package victim

import "time"

// BombPolicy says what makes a fork bomb. Plain birth rate does not: a
// parallel build starts hundreds of processes a second and a threaded
// program thousands of threads at once, and both are what a workspace is
// for. A bomb is a workload that is about to take, or already holds, every
// task pids.max allows and keeps forking, which is what makes the workspace
// unusable (sshd cannot fork for a new login). Any of these signs is enough:
//
//   - Refused: the kernel refused at least Refused forks at pids.max within
//     Window. The workload is at the limit and still forking. A program
//     that once asks for one thread too many is not a bomb; a bomb is
//     refused thousands of times a second.
//   - Exhausted: a fork was refused since the last observation while the
//     processes number at least GrowthFraction of Limit. The limit is
//     reached, so sshd cannot fork for a login, and by many processes, not
//     one program's threads. The classic bomb (`f(){ f|f& }; f`) gets there
//     within a second and then sits at the limit: its copies exit at once,
//     so none is the parent of two, the count no longer grows, and on a CPU
//     its thousands of processes share, a refused fork is rare (seen: 35 s
//     until 50 were refused within 10 s, SSH down all along).
//   - Growth: the number of processes (thread groups, not threads: a
//     program's threads are no bomb however many it starts) is at least
//     GrowthFraction of Limit, rose in each of the last two observations,
//     and at the rate of those two observations the tasks reach Limit
//     within Horizon. This catches a bomb before it reaches the limit, so
//     sshd never has a fork refused. A build runs tens of processes, far
//     below the fraction; a burst of workers that stops growing is not
//     followed.
//   - Branching: the tasks (threads too: a bomb of multi-threaded
//     programs holds few processes and many tasks) are at least
//     GrowthFraction of Limit, the processes rose in each of the last two
//     observations (the verdict says Growing), and at least
//     BranchFraction of the processes fork two or more of the others, and
//     those parents number at least BranchFraction of GrowthFraction of
//     Limit (64 of 4,096 by default: right after a containment, the tasks
//     not yet reaped still count, and a few logins around sshd are no
//     population) (BombDetector.Branching, over a snapshot the caller
//     takes only then). A bomb replicates: every copy starts copies, so
//     about half of its processes are such parents, however slowly a
//     loaded CPU lets it grow. Growth alone would wait for the horizon,
//     and long before a slow bomb nears the limit the CPU it takes leaves
//     none for a login (seen: a new process in the workspace took 1.5 s
//     to start at 645 bomb processes on 2 busy cores). Workers fan out
//     from one parent (a pool, a loop starting sleepers, make's jobs) and
//     a compile runs chains (sh, gcc, cc1): few processes there have two
//     children.
//   - Orphans: the same look (Growing, and a snapshot), when at least a
//     quarter of the processes, and at least BranchFraction of
//     GrowthFraction of Limit, have their parent outside the workspace.
//     The classic bomb (`f(){ f|f& }; f`) replicates too, but each copy
//     exits right after starting its two, so its processes are orphans
//     (the Pod's PID 1 takes them; seen: 45 to 60 %) and few are the parent
//     of two (seen: 18 s before Branching caught one of 2,864 processes on
//     2 busy cores).
//     A workspace's processes descend from its entrypoint or a login, and
//     a loop starting workers is their parent while it runs.
type BombPolicy struct {
	Limit          int           // pids.max the workspace runs under
	Refused        int           // forks refused within Window that make a bomb
	Window         time.Duration // span over which refused forks are counted
	GrowthFraction float64       // processes at or above this share of Limit may be a growing bomb
	Horizon        time.Duration // growth that reaches Limit within Horizon is a bomb
	BranchFraction float64       // growing processes of which at least this share are parents of two or more are a bomb
}

// BombSample is one look at the workspace's pids accounting.
type BombSample struct {
	At      time.Time
	Procs   int    // processes (cgroup.procs entries)
	Tasks   int    // pids.current: tasks charged against the limit, threads and zombies included
	Refused uint64 // the kernel's running count of forks refused at pids.max (pids.events max)
}

// BombVerdict is the detector's answer for one sample.
type BombVerdict struct {
	Bomb    bool
	Reason  string        // "refused", "exhausted", "growth", "branching" or "orphans" when Bomb
	Growing bool          // tasks at GrowthFraction of Limit or more, processes rising at each of the last two observations: worth a look at who forks (Branching)
	Refused int           // forks refused within the window
	Rate    float64       // process growth over the last two observations, per second
	Reach   time.Duration // when growing: projected time until the tasks reach Limit
	Parents int           // after Branching: processes that started two or more of the others
	Orphans int           // after Branching: processes whose parent is outside the workspace
}

// BombDetector applies a BombPolicy to successive samples. The first
// sample (and the first after Reset) is the baseline.
type BombDetector struct {
	Policy BombPolicy

	last    []BombSample // the last three samples, oldest first
	refused []refusal
}

type refusal struct {
	at time.Time
	n  int
}

// Observe records s and says whether the workspace holds a fork bomb.
func (d *BombDetector) Observe(s BombSample) BombVerdict {
	var v BombVerdict
	refusedNow := false
	if n := len(d.last); n > 0 {
		if prev := d.last[n-1]; s.Refused > prev.Refused {
			d.refused = append(d.refused, refusal{s.At, int(s.Refused - prev.Refused)})
			refusedNow = true
		}
	}
	kept := d.refused[:0]
	for _, r := range d.refused {
		if s.At.Sub(r.at) < d.Policy.Window {
			kept = append(kept, r)
			v.Refused += r.n
		}
	}
	d.refused = kept
	d.last = append(d.last, s)
	if len(d.last) > 3 {
		d.last = d.last[len(d.last)-3:]
	}
	if d.Policy.Refused > 0 && v.Refused >= d.Policy.Refused {
		v.Bomb, v.Reason = true, "refused"
		return v
	}
	if refusedNow && float64(s.Procs) >= d.Policy.GrowthFraction*float64(d.Policy.Limit) {
		v.Bomb, v.Reason = true, "exhausted"
		return v
	}
	if len(d.last) < 3 {
		return v
	}
	a, b, c := d.last[0], d.last[1], d.last[2]
	span := c.At.Sub(a.At)
	if b.Procs <= a.Procs || c.Procs <= b.Procs || span <= 0 {
		return v
	}
	v.Rate = float64(c.Procs-a.Procs) / span.Seconds()
	v.Reach = time.Duration(float64(max(d.Policy.Limit-c.Tasks, 0)) / v.Rate * float64(time.Second))
	v.Growing = float64(c.Tasks) >= d.Policy.GrowthFraction*float64(d.Policy.Limit)
	if float64(c.Procs) >= d.Policy.GrowthFraction*float64(d.Policy.Limit) && v.Reach <= d.Policy.Horizon {
		v.Bomb, v.Reason = true, "growth"
	}
	return v
}

// Branching completes a Growing verdict v with a snapshot of the
// workspace's processes: it is a bomb when at least BranchFraction of
// procs, and at least BranchFraction·GrowthFraction·Limit processes, are
// the parent of two or more of procs (parents outside the workspace do
// not count; reason "branching"), or when at least a quarter of procs, and
// at least BranchFraction·GrowthFraction·Limit, have their parent outside the
// workspace (reason "orphans"). It returns v unchanged when v is not
// Growing or already a bomb, and with the parents and orphans it counted
// otherwise.
func (d *BombDetector) Branching(v BombVerdict, procs []Process) BombVerdict {
	if !v.Growing || v.Bomb || len(procs) == 0 || d.Policy.BranchFraction <= 0 {
		return v
	}
	in := make(map[int]bool, len(procs))
	for _, p := range procs {
		in[p.PID] = true
	}
	children := map[int]int{}
	for _, p := range procs {
		if in[p.PPID] && p.PPID != p.PID {
			children[p.PPID]++
		}
	}
	for _, n := range children {
		if n >= 2 {
			v.Parents++
		}
	}
	for _, p := range procs {
		if !in[p.PPID] {
			v.Orphans++
		}
	}
	population := d.Policy.BranchFraction * d.Policy.GrowthFraction * float64(d.Policy.Limit)
	least := max(d.Policy.BranchFraction*float64(len(procs)), population)
	switch {
	case float64(v.Parents) >= least:
		v.Bomb, v.Reason = true, "branching"
	case 4*v.Orphans >= len(procs) && float64(v.Orphans) >= population:
		v.Bomb, v.Reason = true, "orphans"
	}
	return v
}

// Reset forgets every sample, after a bomb was contained, so that the
// processes killed meanwhile and the refusals counted before do not
// trigger it again.
func (d *BombDetector) Reset() {
	d.last, d.refused = nil, nil
}
