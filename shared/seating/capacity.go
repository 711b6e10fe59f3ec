package seating

import (
	"context"
	"fmt"

	"labkeep/shared/labs"
)

// Capacity is what one open of a lab takes from the shared hardware, and
// from which bucket: VM labs count VirtualMachines against MaxVMs, pod
// labs workspace Pods against MaxPods. Buckets are keyed by the lab's
// kind; both are counted under the one capacity lock, so concurrent opens
// of either kind cannot all see room.
type Capacity struct {
	Kind  labs.Kind
	Need  int
	Limit int
}

// labels is the one place a bucket is named for people (refusals, logs).
var labels = map[labs.Kind]string{labs.KindVM: "VMs", labs.KindPod: "workspace Pods"}

// Label is the display name of the bucket labs of kind count against.
func Label(kind labs.Kind) string {
	if l, ok := labels[kind]; ok {
		return l
	}
	return string(kind)
}

// CapacityOf is what an open of lab needs from its bucket under limits.
func CapacityOf(lab labs.Lab, limits Limits) Capacity {
	if lab.Kind == labs.KindPod {
		return Capacity{Kind: labs.KindPod, Need: len(lab.Nodes), Limit: limits.MaxPods}
	}
	return Capacity{Kind: labs.KindVM, Need: lab.VMCount(), Limit: limits.MaxVMs}
}

// Verdict is what Decide says an open (or the head of a line) gets.
type Verdict string

// The verdicts.
const (
	// Cold: create the lab's objects now.
	Cold Verdict = "cold"
	// Claim: take a ready warm-pool instance (it already holds its
	// capacity); if the claim fails, decide again without one.
	Claim Verdict = "claim"
	// Queue: no room; the student joins (or stays in) the line.
	Queue Verdict = "queue"
	// Refuse: no room and the student does not wait.
	Refuse Verdict = "refuse"
)

// Input is everything Decide looks at.
type Input struct {
	Lab string
	Capacity
	// Used is how much of the bucket is in use; ignored when CountFailed.
	Used int
	// CountFailed: the count could not be read. An open is then not
	// refused for capacity: the namespace's ResourceQuota still refuses
	// objects beyond the limit, and one failed list must not lock every
	// student out.
	CountFailed bool
	// Waiting is how many students wait in the bucket's line ahead.
	Waiting int
	// Warm: a ready warm-pool instance of the lab may be claimed (a pool
	// is configured and no claim was tried yet).
	Warm bool
	// Wait: the student joins the line rather than be refused.
	Wait bool
	// Reserved is how much of the bucket reservations hold for their
	// courses and nobody has taken yet (reservation.Held), the seat the
	// student takes included.
	Reserved int
	// Seat: the student takes a seat a reservation holds for their course
	// (reservation.SeatFor), one of this bucket that takes Need.
	Seat bool
}

// Decision is Decide's answer; Reason says why there is no room.
type Decision struct {
	Verdict Verdict
	Reason  string
}

// Decide is the admission rule, in one place: a lab that needs nothing
// from a bucket is created at once. A student taking a seat their course
// reserved is let in ahead of the line: their seat is among Reserved, so
// there is room while Used and Reserved fit the limit (else they are
// refused, never put at the end of the line), and a ready warm instance
// is claimed. Anyone else: nobody waiting and a warm instance
// ready means claim it (it holds its capacity already, and nobody is
// passed over); otherwise there is room only if the bucket has it beside
// the reserved seats and nobody waits in its line (an open must never
// jump the line). When the count failed, the namespace's ResourceQuota
// keeps the cap, and anyone else is let in only while no seats are held
// (the quota knows nothing of reservations). Without room the student
// queues if they wait, or is refused. Used is only read when no claim is
// decided, so the caller counts after a claim failed.
func Decide(in Input) Decision {
	if in.Need <= 0 {
		return Decision{Verdict: Cold}
	}
	var reason string
	switch {
	case in.Seat && in.Warm:
		return Decision{Verdict: Claim}
	case in.Seat:
		if !in.CountFailed && in.Used+in.Reserved > in.Limit {
			// The general line would hold a member behind everyone
			// else: refused, they try again.
			reason = fmt.Sprintf("%d of %d %s in use and %d held for reserved classes, your seat among them: it is free once a lab that started before your class ends; try again then",
				in.Used, in.Limit, Label(in.Kind), in.Reserved)
			return Decision{Verdict: Refuse, Reason: reason}
		}
	case in.Waiting == 0 && in.Warm:
		return Decision{Verdict: Claim}
	case in.CountFailed && in.Reserved > 0:
		// The ResourceQuota keeps the cap, but not the classes' seats:
		// with none to count beside, they are kept for their members.
		reason = fmt.Sprintf("%s in use cannot be counted now and %d are held for reserved classes", Label(in.Kind), in.Reserved)
	case in.CountFailed:
	case in.Used+in.Need+in.Reserved > in.Limit && in.Reserved > 0:
		reason = fmt.Sprintf("%d of %d %s in use and %d held for reserved classes, lab %s needs %d",
			in.Used, in.Limit, Label(in.Kind), in.Reserved, in.Lab, in.Need)
	case in.Used+in.Need > in.Limit:
		reason = fmt.Sprintf("%d of %d %s in use, lab %s needs %d", in.Used, in.Limit, Label(in.Kind), in.Lab, in.Need)
	}
	if reason == "" && !in.Seat && in.Waiting > 0 {
		reason = fmt.Sprintf("%d students wait for capacity", in.Waiting)
	}
	switch {
	case reason == "":
		return Decision{Verdict: Cold}
	case in.Wait:
		return Decision{Verdict: Queue, Reason: reason}
	}
	return Decision{Verdict: Refuse, Reason: reason}
}

// count is how much of kind's bucket is in use.
func (u *Usher) count(ctx context.Context, kind labs.Kind) (int, error) {
	if kind == labs.KindPod {
		return u.cluster.CountWorkspacePods(ctx)
	}
	return u.cluster.CountVMs(ctx)
}
