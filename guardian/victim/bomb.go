package victim

import "time"

// BombPolicy says what makes a fork bomb. Plain birth rate does not: a
// parallel build starts hundreds of processes a second and a threaded
// program thousands of threads at once, and both are what a workspace is
// for. A bomb is a workload that is about to take, or already holds, every
// task pids.max allows and keeps forking, which is what makes the workspace
// unusable (sshd cannot fork for a new login). Two signs, either enough:
//
//   - Refused: the kernel refused at least Refused forks at pids.max within
//     Window. The workload is at the limit and still forking. A program
//     that once asks for one thread too many is not a bomb; a bomb is
//     refused thousands of times a second.
//   - Growth: the number of processes (thread groups, not threads: a
//     program's threads are no bomb however many it starts) is at least
//     GrowthFraction of Limit, rose in each of the last two observations,
//     and at the rate of those two observations the tasks reach Limit
//     within Horizon. This catches a bomb before it reaches the limit, so
//     sshd never has a fork refused. A build runs tens of processes, far
//     below the fraction; a burst of workers that stops growing is not
//     followed.
type BombPolicy struct {
	Limit          int           // pids.max the workspace runs under
	Refused        int           // forks refused within Window that make a bomb
	Window         time.Duration // span over which refused forks are counted
	GrowthFraction float64       // processes at or above this share of Limit may be a growing bomb
	Horizon        time.Duration // growth that reaches Limit within Horizon is a bomb
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
	Reason  string        // "refused" or "growth" when Bomb
	Refused int           // forks refused within the window
	Rate    float64       // process growth over the last two observations, per second
	Reach   time.Duration // when growing: projected time until the tasks reach Limit
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
	if n := len(d.last); n > 0 {
		if prev := d.last[n-1]; s.Refused > prev.Refused {
			d.refused = append(d.refused, refusal{s.At, int(s.Refused - prev.Refused)})
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
	if float64(c.Procs) >= d.Policy.GrowthFraction*float64(d.Policy.Limit) && v.Reach <= d.Policy.Horizon {
		v.Bomb, v.Reason = true, "growth"
	}
	return v
}

// Reset forgets every sample, after a bomb was contained, so that the
// processes killed meanwhile and the refusals counted before do not
// trigger it again.
func (d *BombDetector) Reset() {
	d.last, d.refused = nil, nil
}
