package warmpool

import (
	"cmp"
	"slices"
	"time"
)

// Instance is one unclaimed pool instance of a lab.
type Instance struct {
	ID        string
	Lab       string
	CreatedAt time.Time
	// Ready is whether the instance could be claimed now (its VM or Pod
	// answers); a pool instance still booting is not.
	Ready bool
}

// Input is what Plan needs to know about one lab at one instant.
type Input struct {
	// Target is how many instances the schedule wants now (Schedule.Target).
	Target int
	// Instances are the lab's unclaimed pool instances not already being
	// deleted; a claimed instance is a session's and never appears here.
	Instances []Instance
	// Waiting is how many students wait in line for capacity of the kind
	// this lab uses.
	Waiting int
	// Free is how many more instances of this lab fit in the capacity right
	// now, counting every pool instance (and every instance still being
	// deleted) as used.
	Free int
	// TTL is how long an unclaimed instance may live; an older one is
	// replaced by a fresh one. Zero or less means instances never expire.
	TTL time.Duration
	Now time.Time
}

// Decision is what to do for one lab now: create Create new instances and
// delete the listed ones.
type Decision struct {
	Create int
	Delete []Deletion
}

// Deletion is one instance to delete and why.
type Deletion struct {
	Instance Instance
	Reason   string
}

// The reasons Plan gives for a deletion.
const (
	// ReasonTTL: the instance is older than the TTL (stale images, guest
	// clocks and leases are not handed to a student).
	ReasonTTL = "ttl"
	// ReasonOverTarget: the lab has more instances than the schedule wants.
	ReasonOverTarget = "over-target"
	// ReasonStudentsWaiting: students wait for capacity, and an idle pool
	// instance holds capacity one of them could use.
	ReasonStudentsWaiting = "students-waiting"
)

// Plan decides what to do for one lab now. The rules, in order:
//
//   - An instance past its TTL is deleted (ReasonTTL); while the lab still
//     wants instances, a replacement is created as capacity allows.
//   - While anyone waits (Waiting > 0) the lab wants no pool at all: every
//     idle instance is deleted (ReasonStudentsWaiting) and none is created.
//     A pool is a bet on students to come; students already in line win,
//     and the capacity their instances held goes to the line.
//   - Otherwise instances above Target are deleted (ReasonOverTarget), and
//     instances below Target are created, at most Free of them.
//
// When the pool shrinks, instances that are not ready go first (the newest
// of them first: furthest from being ready), then ready ones, oldest first
// (closest to their TTL, so the ones kept have the most life left). Ties
// go by ID, so the same input always gives the same decision.
//
// Deletions do not free capacity within the same plan: an instance holds
// its capacity until it is gone, so the replacement for an expired instance
// comes once a later plan sees the capacity free. This keeps Create within
// what really fits, never more than Free.
func Plan(in Input) Decision {
	var d Decision
	var live []Instance
	for _, inst := range in.Instances {
		if in.TTL > 0 && in.Now.Sub(inst.CreatedAt) >= in.TTL {
			d.Delete = append(d.Delete, Deletion{Instance: inst, Reason: ReasonTTL})
			continue
		}
		live = append(live, inst)
	}
	want, reason := max(in.Target, 0), ReasonOverTarget
	if in.Waiting > 0 {
		want, reason = 0, ReasonStudentsWaiting
	}
	if len(live) > want {
		slices.SortFunc(live, shrinkOrder)
		for _, inst := range live[:len(live)-want] {
			d.Delete = append(d.Delete, Deletion{Instance: inst, Reason: reason})
		}
		return d
	}
	d.Create = max(min(want-len(live), in.Free), 0)
	return d
}

// shrinkOrder sorts instances in the order a shrinking pool deletes them:
// not ready before ready; not ready ones newest first, ready ones oldest
// first; then by ID.
func shrinkOrder(a, b Instance) int {
	if a.Ready != b.Ready {
		if !a.Ready {
			return -1
		}
		return 1
	}
	byAge := a.CreatedAt.Compare(b.CreatedAt)
	if !a.Ready {
		byAge = -byAge
	}
	return cmp.Or(byAge, cmp.Compare(a.ID, b.ID))
}
