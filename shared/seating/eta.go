package seating

import (
	"sort"
	"time"

	"labkeep/shared/labs"
	"labkeep/shared/reservation"
	"labkeep/shared/session"
)

// Holding is the capacity one live session holds and when it likely and
// at the latest gives it back.
type Holding struct {
	VMs            int
	Likely, Latest time.Time
}

// ETAInput is what QueueETAs needs: the clock, the VM limit, the live
// sessions' holdings, the VMs each waiting student needs in arrival
// order, how long a session started from the line likely and at most
// holds its VMs, and how late after a session's latest end its VMs may
// still be held (the reaper's lag).
type ETAInput struct {
	Now            time.Time
	Capacity       int
	Live           []Holding
	Waiting        []int
	Likely, Latest time.Duration
	Lag            time.Duration
}

// ReservedHoldings are the seats of bucket kind that reservations hold
// for their courses with no live session on them (a member's or the
// class's warm instance, which are holdings of their own), as holdings
// the line waits for: each
// reservation's from now (one that holds later is counted from now too,
// so that no wait is promised shorter than it may be) until its seats are
// released (reservation.Rules.HeldUntil).
func ReservedHoldings(now time.Time, holds []reservation.Hold, uses map[int64]reservation.Use, kind labs.Kind, rules reservation.Rules) []Holding {
	var out []Holding
	for _, h := range holds {
		units := max(0, h.Seats-uses[h.ID].Taken-uses[h.ID].Pooled) * h.PerSeat
		until := rules.HeldUntil(h)
		if h.Kind != kind || units == 0 || !until.After(now) {
			continue
		}
		out = append(out, Holding{VMs: units, Likely: until, Latest: until})
	}
	return out
}

// ETA is one waiting student's likely and latest wait.
type ETA struct{ Likely, Latest time.Duration }

// QueueETAs is the wait of every student in the line, in order. It plays
// the line out twice, first come first served with a head that does not
// fit blocking everyone behind it (as ServeWaitlist does): once with
// every session freeing its VMs at its likely end, once at its latest
// (maxExpiresAt plus Lag, the end no extension can pass). The k-th
// student starts when the VMs freed by the earliest ends (the k-th
// earliest, when every session holds one VM) let them in, never before
// the student ahead; a student served from the line holds their VMs for
// Likely (resp. Latest) from then on, which is how a long line waits for
// sessions that have not started yet. Because every session really frees
// by its latest end and the line is served in this same order, the real
// wait never exceeds ETA.Latest (as long as Capacity does not shrink).
func QueueETAs(in ETAInput) []ETA {
	likely := playOut(in, func(h Holding) time.Time { return h.Likely }, in.Likely, 0)
	latest := playOut(in, func(h Holding) time.Time { return h.Latest }, in.Latest, in.Lag)
	out := make([]ETA, len(in.Waiting))
	for i := range out {
		out[i] = ETA{Likely: likely[i].Sub(in.Now), Latest: latest[i].Sub(in.Now)}
		if out[i].Likely > out[i].Latest {
			out[i].Likely = out[i].Latest
		}
	}
	return out
}

// playOut returns when each waiting student starts if every live session
// gives its VMs back lag after end(h) (never before now) and a started one
// holds them for hold+lag.
func playOut(in ETAInput, end func(Holding) time.Time, hold, lag time.Duration) []time.Time {
	type release struct {
		at  time.Time
		vms int
	}
	var pending []release
	free := in.Capacity
	for _, h := range in.Live {
		at := end(h).Add(lag)
		if at.Before(in.Now) {
			at = in.Now
		}
		pending = append(pending, release{at, h.VMs})
		free -= h.VMs
	}
	sort.Slice(pending, func(i, j int) bool { return pending[i].at.Before(pending[j].at) })
	starts := make([]time.Time, len(in.Waiting))
	t := in.Now
	for i, need := range in.Waiting {
		for free < need && len(pending) > 0 {
			if pending[0].at.After(t) {
				t = pending[0].at
			}
			free += pending[0].vms
			pending = pending[1:]
		}
		// A lab larger than the whole limit never fits; it waits
		// behind everything (the head keeps its place regardless).
		starts[i] = t
		free -= need
		at := t.Add(hold + lag)
		j := sort.Search(len(pending), func(j int) bool { return pending[j].at.After(at) })
		pending = append(pending, release{})
		copy(pending[j+1:], pending[j:])
		pending[j] = release{at, need}
	}
	return starts
}

// EarlyCloseShare is the median share of their granted time that recently
// ended sessions left unused: for each session that ran (had a ready
// time) and ended, (expiresAt − finishedAt) / (expiresAt − startedAt),
// clamped to [0, 1] — 0 for one that ran out its time, near 1 for one
// closed right after it opened. The median, not the mean, so a handful of
// students who open and close at once do not make every ETA optimistic.
// 0 without such sessions.
func EarlyCloseShare(ended []session.Session) float64 {
	var shares []float64
	for _, e := range ended {
		if e.ReadyAt.IsZero() || e.FinishedAt.IsZero() || !e.ExpiresAt.After(e.StartedAt) {
			continue
		}
		u := float64(e.ExpiresAt.Sub(e.FinishedAt)) / float64(e.ExpiresAt.Sub(e.StartedAt))
		shares = append(shares, min(max(u, 0), 1))
	}
	if len(shares) == 0 {
		return 0
	}
	sort.Float64s(shares)
	n := len(shares)
	if n%2 == 1 {
		return shares[n/2]
	}
	return (shares[n/2-1] + shares[n/2]) / 2
}

// HoldingOf is what the live session l holds: vms VMs, given back likely
// when the early-close share of its granted time is left unused (never
// before now) and at the latest at its maxExpiresAt.
func HoldingOf(l session.Session, vms int, share float64, now time.Time) Holding {
	likely := l.ExpiresAt.Add(-time.Duration(share * float64(l.ExpiresAt.Sub(l.StartedAt))))
	if likely.Before(now) {
		likely = now
	}
	return Holding{VMs: vms, Likely: likely, Latest: l.MaxExpiresAt}
}
