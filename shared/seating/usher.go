// Package seating decides who gets the capacity every lab session shares,
// and keeps the two things that wait for it: the line of students (the
// waitlist) and the warm pool of instances started ahead of them.
//
// The contract: an open is admitted (Usher.Seat) under the one capacity
// lock shared by every labkeep instance using the database, so counting
// what is in use and creating more is one atomic step and concurrent opens
// cannot all see room. The rule itself is Decide, a pure function: with
// nobody waiting and a ready warm instance the student takes that
// instance; otherwise there is room only if the bucket (VMs, workspace
// Pods, keyed by labs.Kind) has it and nobody waits in its line, so an
// open never jumps the line; without room the student queues if they
// asked to wait, else is refused. Whatever frees capacity hands it to the
// line at once (Usher.Freed), and the reaper serves the line and keeps the
// warm pool at its schedule's target every run as a backstop.
//
// Why one package and one type: the lock, the line and the pool are one
// resource seen three ways. A pool instance holds capacity a waiting
// student may need; serving the line, claiming an instance and growing the
// pool must each count and act under the same lock. Usher owns all three;
// package session keeps the life of one session and reaches seating only
// through its session.Seating port.
package seating

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"labkeep/shared/labs"
	"labkeep/shared/reservation"
	"labkeep/shared/session"
	"labkeep/shared/setting"
)

// Store is the database as seating needs it: the session rows and the
// capacity lock.
type Store interface {
	session.Store
	// LockCapacity blocks until this caller holds the capacity lock shared
	// by every labkeep instance using the database, so counting VMs and
	// creating new ones is one atomic step. unlock must be called; the lock
	// is also released if the process dies.
	LockCapacity(ctx context.Context) (unlock func(), err error)
}

// Cluster is the cluster as seating needs it: creating sessions' objects
// and counting what the shared hardware holds.
type Cluster interface {
	session.Cluster
	// CountVMs counts every VirtualMachine in the namespace — labkeep's or
	// not, any environment — because they all use the same hardware.
	CountVMs(ctx context.Context) (int, error)
	// CountWorkspacePods counts every Pod in the namespace that has a
	// deadline (spec.activeDeadlineSeconds) and has not finished —
	// labkeep's workspace Pods and anyone else's — exactly what the
	// namespace's Terminating-scoped ResourceQuota counts.
	CountWorkspacePods(ctx context.Context) (int, error)
}

// Limits bound the capacity seating hands out, and how long it waits.
type Limits struct {
	// MaxVMs is the limit of VirtualMachines live in the namespace.
	MaxVMs int
	// MaxPods is the limit of workspace Pods (pod labs) live in the
	// namespace, counted as CountWorkspacePods does.
	MaxPods int
	// CapacityWait bounds how long an open queues for the capacity lock;
	// past it the open is refused with ErrNoCapacity. Keep it well below
	// the reaper's provisioning grace, which fails a queued row (it has no
	// VMs yet).
	CapacityWait time.Duration
	// CleanupTimeout bounds the rollback after a failed open, which runs
	// even if the caller's request was cancelled.
	CleanupTimeout time.Duration
	// QueueIdle is how long a waitlist entry nobody polls keeps its
	// place; past it the entry is dropped at the next look.
	QueueIdle time.Duration
}

// DefaultLimits are the limits unless told otherwise: the capacity wait
// is half the reaper's default 2-minute provisioning grace.
func DefaultLimits() Limits {
	return Limits{MaxVMs: 8, MaxPods: 20, CapacityWait: 60 * time.Second, CleanupTimeout: 30 * time.Second, QueueIdle: DefaultQueueIdle}
}

// Validate reports limits seating cannot work with.
func (l Limits) Validate() error {
	return errors.Join(
		setting.AtLeast("MaxVMs", l.MaxVMs, 1),
		setting.AtLeast("MaxPods", l.MaxPods, 1),
		setting.Positive("CapacityWait", l.CapacityWait),
		setting.Positive("CleanupTimeout", l.CleanupTimeout),
		setting.Positive("QueueIdle", l.QueueIdle))
}

// Config is what an Usher is built from.
type Config struct {
	// Rows starts and unwinds the rows seating creates (served entries,
	// warm-pool instances), the same way Service does its opens'.
	Rows    *session.Starter
	Store   Store
	Cluster Cluster
	Labs    session.Catalog
	Limits  Limits
	// Waitlist is the line; nil: nobody can wait, a full open is refused.
	Waitlist Waitlist
	// Pool is the warm pool; nil: every open provisions cold.
	Pool *WarmPool
	// Homes names the home a served entry's session holds (an entry keeps
	// only the open's student, lab and key); nil: a lab that keeps a home
	// is never served from the line.
	Homes session.Homes
	// Reservations are courses' reserved seats (nil: none), held under
	// ReservationRules.
	Reservations     Reservations
	ReservationRules reservation.Rules
	// Now is the clock; time.Now in production.
	Now func() time.Time
	Log *slog.Logger
	// Metrics counts the line's events and warm-pool claims; nil counts
	// nothing.
	Metrics Metrics
}

// Reservations is what admission reads and writes of courses' reserved
// seats (pgstore).
type Reservations interface {
	// Holding lists the standing reservations whose windows overlap from
	// to to, and how live sessions use the seats of each, by id: taken by
	// members' sessions, pooled by the class's unclaimed warm instances.
	Holding(ctx context.Context, from, to time.Time) ([]reservation.Hold, map[int64]reservation.Use, error)
	// TakeSeat records that live session id took a seat of reservation
	// reservationID.
	TakeSeat(ctx context.Context, id string, reservationID int64) error
}

// Usher owns the capacity lock, the line and the warm pool. It holds no
// state between calls (the database does), so any number of instances
// can serve at once.
type Usher struct {
	rows     *session.Starter
	store    Store
	cluster  Cluster
	labs     session.Catalog
	limits   Limits
	waitlist Waitlist
	pool     *WarmPool
	homes    session.Homes
	booked   Reservations
	rules    reservation.Rules
	clock    func() time.Time
	log      *slog.Logger
	metrics  Metrics
	// turn is held by the one open of this process that waits for, or
	// holds, the capacity lock (turn.go); counts are what the decisions
	// under it counted last.
	turn   chan struct{}
	counts *lastCounts
}

var _ session.Seating = (*Usher)(nil)

// NewUsher builds an Usher from c.
func NewUsher(c Config) *Usher {
	u := &Usher{rows: c.Rows, store: c.Store, cluster: c.Cluster, labs: c.Labs, limits: c.Limits,
		waitlist: c.Waitlist, pool: c.Pool, homes: c.Homes, booked: c.Reservations, rules: c.ReservationRules,
		clock: c.Now, log: c.Log, metrics: c.Metrics, turn: make(chan struct{}, 1), counts: newLastCounts()}
	if u.metrics == nil {
		u.metrics = noMetrics{}
	}
	if u.log == nil {
		u.log = slog.New(slog.DiscardHandler)
	}
	return u
}

func (u *Usher) now() time.Time { return u.clock().UTC().Truncate(time.Microsecond) }

// warm reports whether an open of lab may claim a warm instance: one of
// the general pool when the schedule names the lab, or, for a member
// taking a seat their class reserved (seat), one made for the class. A
// warm instance was made before its student was known, without their
// home: a lab that keeps one is never served from a pool.
func (u *Usher) warm(lab labs.Lab, seat bool) bool {
	return u.pool != nil && lab.Home == nil && (seat || slices.Contains(u.pool.Schedule.Labs(), lab.Name))
}

// lock takes this process's turn, then the database's capacity lock,
// waiting at most Limits.CapacityWait for both; timedOut reports that the
// wait ran out while the caller still waited. While it waits for its
// turn, refuse (when not nil) is asked about every count a decision
// under the lock records in bucket kind, and its error ends the wait
// (turn.go). unlock releases both.
func (u *Usher) lock(ctx context.Context, kind labs.Kind, refuse func(counted) error) (unlock func(), timedOut bool, err error) {
	lctx, cancel := context.WithTimeout(ctx, u.limits.CapacityWait)
	defer cancel()
	release, err := u.takeTurn(lctx, kind, refuse)
	if err == nil {
		var dbUnlock func()
		if dbUnlock, err = u.store.LockCapacity(lctx); err == nil {
			return func() { dbUnlock(); release() }, false, nil
		}
		release()
	}
	return nil, lctx.Err() != nil && ctx.Err() == nil && !errors.Is(err, session.ErrNoCapacity), err
}

// Seat implements session.Seating: it checks capacity and creates the
// objects under the capacity lock (see Decide for the rule). started
// reports whether any object may have been created (false when refused
// before the first create, so there is nothing to roll back). With wait,
// an open that finds no room joins the line under the same lock and comes
// back with its place (started false, placed.Waiting, err nil).
func (u *Usher) Seat(ctx context.Context, sess session.Session, lab labs.Lab, wait bool) (started bool, placed session.Standing, err error) {
	admitted := func() {} // records the admission's count (below)
	if c := CapacityOf(lab, u.limits); c.Need > 0 {
		// A count made while it waits may refuse it at once.
		unlock, timedOut, err := u.lock(ctx, c.Kind, func(last counted) error { return u.refusal(last, sess, lab, c, wait) })
		switch {
		case errors.Is(err, session.ErrNoCapacity):
			return false, placed, err
		case err != nil && timedOut:
			return false, placed, fmt.Errorf("%w: waited %s for the capacity lock (other opens are queued)", session.ErrNoCapacity, u.limits.CapacityWait)
		case err != nil:
			return false, placed, fmt.Errorf("capacity lock: %w", err)
		}
		defer unlock()
		// The open may have queued long enough for its row to be finished
		// (a close, or the reaper's ghost rule): create nothing then.
		if _, err := u.rows.ConfirmLive(ctx, sess.ID); err != nil {
			return false, placed, err
		}
		waiting, err := u.waiting(ctx, c.Kind)
		if err != nil {
			return false, placed, err
		}
		in := Input{Lab: lab.Name, Capacity: c, Waiting: waiting, Wait: wait && u.waitlist != nil}
		seat, err := u.reserved(ctx, &in, sess, lab)
		if err != nil {
			return false, placed, err
		}
		in.Warm = u.warm(lab, in.Seat)
		if Decide(in).Verdict == Claim {
			// A member claims their class's own instance first; whichever
			// instance they get takes their seat with the handover.
			claimed, ok, taken := session.Session{}, false, int64(0)
			if in.Seat {
				taken = seat
				claimed, ok = u.claim(ctx, sess, lab, seat, taken)
			}
			if !ok && u.warm(lab, false) {
				claimed, ok = u.claim(ctx, sess, lab, 0, taken)
			}
			if ok {
				return false, session.Standing{Session: &claimed}, nil
			}
			in.Warm = false
		}
		if in.Used, err = u.count(ctx, c.Kind); err != nil {
			u.log.Warn("cannot count capacity in use; relying on the ResourceQuota", "counting", Label(c.Kind), "session", sess.ID, "err", err)
			in.CountFailed = true
		}
		// What the decision counted is recorded once it took effect, for
		// the opens waiting their turn (turn.go): an admission only once
		// its objects exist, so a failed one refuses nobody.
		d := Decide(in)
		switch d.Verdict {
		case Queue:
			w, err := u.enqueue(ctx, sess)
			if err != nil {
				return false, placed, err
			}
			u.recordDecision(in, d)
			return false, session.Standing{Waiting: &w}, nil
		case Refuse:
			u.recordDecision(in, d)
			return false, placed, fmt.Errorf("%w: %s", session.ErrNoCapacity, d.Reason)
		}
		if in.Seat {
			if err := u.booked.TakeSeat(ctx, sess.ID, seat); err != nil {
				return false, placed, fmt.Errorf("taking a reserved seat: %w", err)
			}
		}
		admitted = func() { u.recordDecision(in, d) }
	}
	if err := u.cluster.Provision(ctx, sess, lab); err != nil {
		if errors.Is(err, session.ErrNoCapacity) {
			return true, placed, err
		}
		return true, placed, fmt.Errorf("%w: %w", session.ErrProvisioning, err)
	}
	admitted()
	return true, placed, nil
}

// reserved fills in's Reserved (what reservations of its bucket hold and
// nobody took) and Seat (whether sess's student takes a seat their course
// reserved), and returns that reservation's id. Under the capacity lock,
// so the seats taken it counts are exact.
func (u *Usher) reserved(ctx context.Context, in *Input, sess session.Session, lab labs.Lab) (int64, error) {
	holds, uses, now, err := u.holding(ctx)
	if err != nil {
		return 0, err
	}
	in.Reserved = reservation.Held(now, holds, uses, in.Kind, u.rules)
	seat, ok := reservation.SeatFor(now, holds, uses, sess.Courses, lab.Name, u.rules)
	// A seat booked when the lab took something else (the catalog
	// changed since) is not the one the open needs: the member is in the
	// general line, and the cap stays exact.
	in.Seat = ok && seat.Kind == in.Kind && seat.PerSeat == in.Need
	return seat.ID, nil
}

// held is what reservations of bucket kind hold now and nobody took:
// capacity the line and the warm pool leave alone.
func (u *Usher) held(ctx context.Context, kind labs.Kind) (int, error) {
	holds, uses, now, err := u.holding(ctx)
	return reservation.Held(now, holds, uses, kind, u.rules), err
}

// holding reads the reservations that may hold seats now (from a lead
// before their start), with how their seats are used, and the time it
// read them for.
func (u *Usher) holding(ctx context.Context) ([]reservation.Hold, map[int64]reservation.Use, time.Time, error) {
	now := u.now()
	if u.booked == nil {
		return nil, nil, now, nil
	}
	holds, uses, err := u.booked.Holding(ctx, now, now.Add(u.rules.Lead+time.Microsecond))
	if err != nil {
		return nil, nil, now, fmt.Errorf("reading the reservations: %w", err)
	}
	return holds, uses, now, nil
}

// ReservedStat is one reservation holding seats now: its course, lab and
// seats, those its members took, those its warm instances hold for them,
// and those still held for its course with nothing running.
type ReservedStat struct {
	Course, Lab                string
	Seats, Taken, Pooled, Held int
}

// Reserved lists the reservations holding seats now (for metrics).
func (u *Usher) Reserved(ctx context.Context) ([]ReservedStat, error) {
	holds, uses, now, err := u.holding(ctx)
	if err != nil {
		return nil, err
	}
	var out []ReservedStat
	for _, h := range holds {
		if u.rules.Holding(h, now) {
			use := uses[h.ID]
			out = append(out, ReservedStat{Course: h.Course, Lab: h.Lab, Seats: h.Seats, Taken: use.Taken, Pooled: use.Pooled,
				Held: max(0, h.Seats-use.Taken-use.Pooled)})
		}
	}
	return out, nil
}

// InUse is how much of each bucket is in use now, by kind (read without
// the capacity lock: a figure for people, never for admission).
func (u *Usher) InUse(ctx context.Context) (map[labs.Kind]int, error) {
	out := map[labs.Kind]int{}
	for _, kind := range []labs.Kind{labs.KindPod, labs.KindVM} {
		n, err := u.count(ctx, kind)
		if err != nil {
			return nil, fmt.Errorf("counting %s in use: %w", Label(kind), err)
		}
		out[kind] = n
	}
	return out, nil
}

// Freed serves the line on a context that outlives the caller's request
// (capacity freed by a request must be handed on even if its client has
// gone).
func (u *Usher) Freed(ctx context.Context) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), u.limits.CapacityWait+u.limits.CleanupTimeout)
	defer cancel()
	if _, err := u.ServeWaitlist(cctx); err != nil {
		u.log.Warn("cannot serve the waitlist; the reaper will", "err", err)
	}
}

// Metrics counts what happens to the line and the warm pool; the
// entry points implement it (Prometheus), so seating depends on no
// metrics library.
type Metrics interface {
	// QueueEvent counts one event of a waitlist entry of lab.
	QueueEvent(lab string, ev QueueEvent)
	// PoolClaimed counts one try of lab's warm pool by an open or a
	// waitlist head.
	PoolClaimed(lab string, result ClaimResult)
}

// QueueEvent is what happened to a waitlist entry.
type QueueEvent string

// The events of an entry: it joins, then is served (turned into a
// provisioning session), dropped (nobody polled it within QueueIdle, or
// its lab left the catalog) or left (closeSession while queued).
const (
	QueueJoined  QueueEvent = "joined"
	QueueServed  QueueEvent = "served"
	QueueDropped QueueEvent = "dropped"
	QueueLeft    QueueEvent = "left"
)

// ClaimResult is how a try of the warm pool went.
type ClaimResult string

// The results of a claim: ok, empty (no ready instance), failed (the
// cluster step failed and the open provisioned cold).
const (
	ClaimOK     ClaimResult = "ok"
	ClaimEmpty  ClaimResult = "empty"
	ClaimFailed ClaimResult = "failed"
)

type noMetrics struct{}

func (noMetrics) QueueEvent(string, QueueEvent)   {}
func (noMetrics) PoolClaimed(string, ClaimResult) {}
