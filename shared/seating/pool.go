package seating

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"

	"labkeep/shared/labs"
	"labkeep/shared/lifetime"
	"labkeep/shared/reservation"
	"labkeep/shared/session"
	"labkeep/shared/warmpool"
)

// The warm pool. Per lab, a number of instances (the lab's VMs or
// workspace Pod) is provisioned ahead of any student, as the schedule
// (warmpool.Schedule) asks, so an open can take a ready one instead of
// waiting for a cold provision. The pool's ports pass an instance as an
// Instance; it is stored as an ordinary session row (Pool
// session.PoolIdle, student PoolStudent), so it counts against the same
// capacity, the reaper's inventory sees its objects as a live session's
// (never orphans), its ghosts and ends go through session.End like any session's,
// and a waiting student's place in the line is never jumped: capacity a
// pool instance holds is capacity in use.
//
// A claim (PoolStore.ClaimPooled) first marks the instance spent and
// commits that, then the cluster authorizes the student's public key on
// the running instance (PoolCluster.Claim, bounded by ClaimTimeout), then
// the open's own provisioning row (or the waitlist entry) goes and the
// instance's row becomes the student's session (Handover). Two opens
// never get one instance: the second skips the locked row, and nobody
// claims a spent one. If the cluster step or the handover fails, the
// instance is ended (it may hold part of a student's credentials) and the
// open provisions cold; if the process dies mid-claim, the spent instance
// expires at once the claim could no longer complete, and the reaper ends
// it.

// Instance is one unclaimed warm-pool instance as the pool's ports pass
// it: what a claim reads before the instance becomes a student's session.
// It is not a session: it has no student, no key and no place in any
// line, and nothing outside the pool (the student's calls, the HTTP view)
// ever sees one. How it is stored is the adapters' business (pgstore
// keeps it as a sessions row, so it counts against the same capacity and
// the reaper sees its objects as a live session's).
type Instance struct {
	// ID names the instance's objects; a claim keeps it, so it becomes the
	// claimed session's id.
	ID    string
	Lab   string
	Kind  labs.Kind
	Nodes []session.Node
	// Window is the instance's own: StartedAt is when it was created,
	// ExpiresAt that plus the pool's TTL.
	lifetime.Window
	// Ready is true once every node is ready (the row is running); only a
	// ready instance is claimed.
	Ready bool
}

// Handover is what a claim makes of an instance: the student it now
// belongs to, the key their nodes authorize, and their session's window
// and ready time. The instance's id, lab and nodes stay.
type Handover struct {
	Student    string
	StudentKey string
	lifetime.Window
	// ReadyAt is when the student could log in: their time to ready.
	ReadyAt time.Time
	// Seat is the reservation whose seat the student takes (0: none),
	// recorded with the handover itself, so a member's seat is never
	// counted free while their instance runs.
	Seat int64
}

// PoolStore is the database side of the warm pool.
type PoolStore interface {
	// ClaimPooled takes the oldest ready instance of lab held for
	// reservation class (0: an instance of the general pool, held for no
	// reservation) whose TTL has not passed at at (skipping instances
	// another claim or a
	// session.End holds), checks that the row or waitlist entry replaces
	// (the student's open or place in line) still exists
	// (session.ErrNoSession if neither does) and marks the instance
	// session.PoolSpent, committed, due at abandon; only then calls
	// claim(instance), so a spent instance, which may hold the student's
	// key, is never claimed again, even if this caller dies. If claim
	// returns nil error, it deletes what replaces names and makes the
	// instance the student's session as the handover says (marked
	// session.PoolClaimed, ClaimedFor replaces) and returns that session.
	// session.ErrNoSession (and a zero inst) if lab has no ready instance.
	// An error before claim ran changes nothing; after it, the instance
	// stays spent and the caller ends it. inst is the instance as read
	// when there was one.
	ClaimPooled(ctx context.Context, lab string, class int64, replaces string, at, abandon time.Time, claim func(Instance) (Handover, error)) (inst Instance, claimed session.Session, err error)
}

// PoolCluster is the cluster side of a claim.
type PoolCluster interface {
	// Claim makes the running instance inst the student's whose public
	// key is studentKey: their key (with the platform's) authorized on
	// every node, without a restart.
	Claim(ctx context.Context, inst Instance, studentKey string, lab labs.Lab) error
}

// PoolStudent is the student of every unclaimed warm-pool instance's
// row. The one-live-session-per-student rule does not hold for unclaimed
// rows (the store exempts them), so any number of instances share it. It
// is one of the platform's reserved ids (session.Reserved): no token
// acts as it.
const PoolStudent = session.ReservedPrefix + "pool"

// WarmPool configures the Usher's warm pool.
type WarmPool struct {
	Schedule warmpool.Schedule
	// TTL is how long an unclaimed instance lives before it is replaced.
	TTL     time.Duration
	Store   PoolStore
	Cluster PoolCluster
}

// DefaultPoolTTL and DefaultPoolLead are the warm pool's defaults: an
// instance is replaced after 4 hours, and a scheduled window's instances
// are started 10 minutes before it opens.
const (
	DefaultPoolTTL  = 4 * time.Hour
	DefaultPoolLead = 10 * time.Minute
)

// ClaimTimeout bounds a claim's cluster step (the student's key written
// to the instance). A spent instance whose claim has not completed by
// twice that is expired, so the reaper ends it.
const ClaimTimeout = 30 * time.Second

// claim gives the open's row sess (or a waitlist entry with sess.ID)
// a ready pool instance of lab, one held for reservation class when not
// 0 (its member's), and records the session in reservation seat's seat
// when not 0; ok is false when none could be claimed, and the open
// provisions cold. Called under the capacity lock, only when nobody waits
// ahead of the student in their bucket's line (or they take a seat their
// class reserved).
func (u *Usher) claim(ctx context.Context, sess session.Session, lab labs.Lab, class, seat int64) (claimed session.Session, ok bool) {
	p := u.pool
	if p == nil {
		return session.Session{}, false
	}
	tried := false // the cluster step ran: the instance may hold the student's key
	now := u.now()
	cctx, cancel := context.WithTimeout(ctx, ClaimTimeout)
	defer cancel()
	instance, claimed, err := p.Store.ClaimPooled(ctx, lab.Name, class, sess.ID, now, now.Add(2*ClaimTimeout), func(inst Instance) (Handover, error) {
		tried = true
		h := Handover{Student: sess.Student, StudentKey: sess.StudentKey, Window: u.rows.Policy.Open(u.now()), Seat: seat}
		if err := p.Cluster.Claim(cctx, inst, sess.StudentKey, lab); err != nil {
			return h, err
		}
		// The student could log in from now: that is their time to ready.
		h.ReadyAt = u.now()
		return h, nil
	})
	switch {
	case err == nil:
		u.metrics.PoolClaimed(lab.Name, ClaimOK)
		u.log.Info("claimed from the warm pool", "session", claimed.ID, "lab", lab.Name, "student", sess.Student, "for", sess.ID, "from reservation", class, "seat of", seat)
		u.rows.Ready(claimed)
		return claimed, true
	case !tried && instance.ID == "" && errors.Is(err, session.ErrNoSession):
		u.metrics.PoolClaimed(lab.Name, ClaimEmpty)
		return session.Session{}, false
	case !tried:
		// The open was closed meanwhile, or a database fault before the
		// mark: the instance was not touched and stays in the pool.
		u.log.Warn("no warm pool claim", "lab", lab.Name, "for", sess.ID, "err", err)
		return session.Session{}, false
	}
	u.metrics.PoolClaimed(lab.Name, ClaimFailed)
	u.log.Warn("cannot claim a warm pool instance; provisioning cold", "lab", lab.Name, "instance", instance.ID, "err", err)
	// Part of the student's credentials may have reached it: it is never
	// handed to anyone else.
	u.retire(ctx, instance.ID, "claim failed: "+err.Error())
	return session.Session{}, false
}

// retire ends an unclaimed (idle or spent) instance through session.End,
// recording why.
func (u *Usher) retire(ctx context.Context, id, why string) {
	reason := session.EndReason{Kind: session.EndClosed, Actor: session.ActorReaper, Detail: "warm pool: " + why}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), u.limits.CleanupTimeout)
	defer cancel()
	_, _, err := session.End(cctx, u.store, u.cluster, id, session.Ending{
		Reason: reason, EvenIfTeardownFails: true,
		Due: func(cur session.Session) bool { return cur.Pool.Unclaimed() },
	}, u.now())
	if err != nil {
		u.log.Warn("cannot end warm pool instance; the reaper retries", "session", id, "err", err)
	}
}

// PoolStatus is one lab's warm pool as the admin status shows it.
type PoolStatus struct {
	Lab    string `json:"lab"`
	Target int    `json:"target"`
	// Idle instances are ready to be claimed; Starting ones not yet.
	Idle     int `json:"idle"`
	Starting int `json:"starting"`
	// Claimed is how many live sessions came from the pool.
	Claimed int `json:"claimed"`
}

// PoolStatuses summarises every lab of the schedule (and any lab that
// still has pool rows) from the live rows at now, by lab name.
func PoolStatuses(sched warmpool.Schedule, live []session.Session, now time.Time) []PoolStatus {
	by := map[string]*PoolStatus{}
	var order []string
	get := func(lab string) *PoolStatus {
		if p, ok := by[lab]; ok {
			return p
		}
		p := &PoolStatus{Lab: lab, Target: sched.Target(lab, now)}
		by[lab] = p
		order = append(order, lab)
		return p
	}
	for _, lab := range sched.Labs() {
		get(lab)
	}
	for _, l := range live {
		switch {
		case l.Pool == session.PoolIdle && l.Status == session.StatusRunning:
			get(l.Lab).Idle++
		case l.Pool == session.PoolIdle:
			get(l.Lab).Starting++
		case l.Pool == session.PoolClaimed:
			get(l.Lab).Claimed++
		}
	}
	slices.Sort(order)
	out := make([]PoolStatus, 0, len(order))
	for _, lab := range order {
		out = append(out, *by[lab])
	}
	return out
}

// Pools is every lab's warm pool now (PoolStatuses over the live rows);
// none without a pool.
func (u *Usher) Pools(ctx context.Context) ([]PoolStatus, error) {
	if u.pool == nil {
		return []PoolStatus{}, nil
	}
	live, err := u.store.ListLive(ctx)
	if err != nil {
		return nil, err
	}
	return PoolStatuses(u.pool.Schedule, live, u.now()), nil
}

// PoolReport is what one maintenance pass did.
type PoolReport struct {
	Created int
	Deleted map[string]int // by reason
}

// MaintainPools runs the warm pool plan (warmpool.Plan) for every lab of
// the schedule: provisioning pool instances are checked against the
// cluster (and turn running when ready; the line is then served, so a
// waiting student gets a newly ready instance), instances past their TTL, over
// the target, or holding capacity a waiting student needs are ended
// through session.End, and new instances are created, each under the capacity
// lock with its own count, so the pool never takes capacity a student's
// open or the line got first. The reaper calls it every run. A lab that
// left the catalog has its instances ended.
func (u *Usher) MaintainPools(ctx context.Context) (PoolReport, error) {
	rep := PoolReport{Deleted: map[string]int{}}
	p := u.pool
	if p == nil {
		return rep, nil
	}
	live, err := u.store.ListLive(ctx)
	if err != nil {
		return rep, err
	}
	readied := false
	for _, l := range live {
		if l.Pool == session.PoolIdle && l.Status == session.StatusProvisioning {
			readied = u.rows.Refresh(ctx, l).Status == session.StatusRunning || readied
		}
	}
	if readied {
		// An instance that just became ready goes to the head of its
		// line, if anyone waits, before the plan would shrink the pool.
		u.Freed(ctx)
		if live, err = u.store.ListLive(ctx); err != nil {
			return rep, err
		}
	}
	labsToPlan := p.Schedule.Labs()
	for _, l := range live {
		if l.Pool == session.PoolIdle && l.Reservation == 0 && !slices.Contains(labsToPlan, l.Lab) {
			labsToPlan = append(labsToPlan, l.Lab)
		}
	}
	var errs []error
	for _, name := range labsToPlan {
		if err := u.maintainLab(ctx, name, live, &rep); err != nil {
			errs = append(errs, fmt.Errorf("warm pool %s: %w", name, err))
		}
	}
	if err := u.maintainClasses(ctx, live, &rep); err != nil {
		errs = append(errs, fmt.Errorf("classes' warm instances: %w", err))
	}
	return rep, errors.Join(errs...)
}

// ReasonClassReleased: a class's warm instance nobody claimed while its
// reservation held its seats (released, ended or cancelled).
const ReasonClassReleased = "class-released"

// maintainClasses keeps every reservation's warm instances, with no
// schedule written for them: from its lead, one for each seat no member
// took (reservation.Rules.PoolTarget), so they are ready when the class
// starts and a member's open claims one; one over that (a member opened
// before it was ready) is ended, and so is every one left once the
// reservation stops holding its seats. A lab that keeps a home is never
// served from a pool, a class's neither.
func (u *Usher) maintainClasses(ctx context.Context, live []session.Session, rep *PoolReport) error {
	if u.booked == nil {
		return nil
	}
	holds, uses, now, err := u.holding(ctx)
	if err != nil {
		return err
	}
	targets := map[int64]int{}
	for _, h := range holds {
		if lab, c, ok := u.classLab(h); ok && c.Need > 0 && lab.Home == nil {
			targets[h.ID] = u.rules.PoolTarget(h, uses[h.ID], now)
		}
	}
	ended, planned := false, map[int64]bool{}
	for _, l := range live {
		if l.Pool != session.PoolIdle || l.Reservation == 0 || planned[l.Reservation] {
			continue
		}
		// Once per reservation: the plan shrinks its instances to target.
		planned[l.Reservation] = true
		target := targets[l.Reservation]
		d := warmpool.Plan(warmpool.Input{Target: target, Instances: classInstances(live, l.Lab, l.Reservation), Now: now})
		for _, del := range d.Delete {
			reason := del.Reason
			if target == 0 {
				reason = ReasonClassReleased
			}
			u.retire(ctx, del.Instance.ID, reason)
			rep.Deleted[reason]++
			ended = true
		}
	}
	if ended {
		u.Freed(ctx)
	}
	var errs []error
	for _, h := range holds {
		if targets[h.ID] > uses[h.ID].Pooled {
			if err := u.growClass(ctx, h.ID, rep); err != nil {
				errs = append(errs, fmt.Errorf("reservation %d (%s, %s): %w", h.ID, h.Course, h.Lab, err))
			}
		}
	}
	return errors.Join(errs...)
}

// classLab is the lab of reservation h as the catalog has it now, and
// what a seat takes; ok is false when the lab left the catalog or now
// takes other capacity than the reservation booked (its seats are then
// not the lab's, as at admission).
func (u *Usher) classLab(h reservation.Hold) (labs.Lab, Capacity, bool) {
	lab, known := u.labs.Get(h.Lab)
	if !known {
		return lab, Capacity{}, false
	}
	c := CapacityOf(lab, u.limits)
	return lab, c, c.Kind == h.Kind && c.Need == h.PerSeat
}

// growClass creates reservation id's missing warm instances under the
// capacity lock, reading its seats again there. Each comes out of the
// class's own held seats, so what runs and what every class holds stays
// within the limit (no room beyond that: fewer are made, and the rest at a
// later run).
func (u *Usher) growClass(ctx context.Context, id int64, rep *PoolReport) error {
	unlock, _, err := u.lock(ctx, "", nil)
	if err != nil {
		return fmt.Errorf("capacity lock: %w", err)
	}
	defer unlock()
	holds, uses, now, err := u.holding(ctx)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(holds, func(h reservation.Hold) bool { return h.ID == id })
	if i < 0 {
		return nil // cancelled meanwhile
	}
	h, use := holds[i], uses[id]
	lab, c, ok := u.classLab(h)
	want := u.rules.PoolTarget(h, use, now) - use.Pooled
	if !ok || lab.Home != nil || c.Need <= 0 || want <= 0 {
		return nil
	}
	used, err := u.count(ctx, c.Kind)
	if err != nil {
		return err
	}
	others := reservation.Held(now, holds, uses, c.Kind, u.rules) - max(0, h.Seats-use.Taken-use.Pooled)*h.PerSeat
	room := max(0, c.Limit-used-others) / c.Need
	for range min(want, room) {
		if err := u.createInstance(ctx, lab, h); err != nil {
			return err
		}
		rep.Created++
	}
	return nil
}

// maintainLab plans lab name's pool from the live rows and carries the
// plan out.
func (u *Usher) maintainLab(ctx context.Context, name string, live []session.Session, rep *PoolReport) error {
	p := u.pool
	now := u.now()
	lab, known := u.labs.Get(name)
	in := warmpool.Input{TTL: p.TTL, Now: now}
	if known {
		in.Target = p.Schedule.Target(name, now)
	}
	in.Instances = poolInstances(live, name)
	// Deletions first, outside the capacity lock (session.End holds the row lock,
	// and what it frees is handed to the line right after).
	var c Capacity
	if known {
		c = CapacityOf(lab, u.limits)
		waiting, err := u.waiting(ctx, c.Kind)
		if err != nil {
			return err
		}
		in.Waiting = waiting
		if waiting > 0 {
			in.Instances = u.spareBooting(ctx, name, in.Instances)
		}
	}
	d := warmpool.Plan(in)
	for _, del := range d.Delete {
		u.retire(ctx, del.Instance.ID, del.Reason)
		rep.Deleted[del.Reason]++
	}
	if len(d.Delete) > 0 {
		u.Freed(ctx)
	}
	if !known || in.Target <= len(in.Instances)-len(d.Delete) {
		return nil
	}
	return u.grow(ctx, lab, c, in, rep)
}

// spareBooting leaves out of the plan up to as many of lab's booting
// instances as students wait for lab itself: each serves one of them as
// soon as it is ready (MaintainPools serves the line when an instance
// turns ready), sooner than the cold provision its freed capacity would
// start. Shrinking first while students wait is for capacity that
// instances hold and a student of another lab needs.
func (u *Usher) spareBooting(ctx context.Context, lab string, in []warmpool.Instance) []warmpool.Instance {
	if u.waitlist == nil {
		return in
	}
	line, err := u.waitlist.Line(ctx)
	if err != nil {
		return in
	}
	n := 0
	for _, e := range line {
		if e.Lab == lab {
			n++
		}
	}
	var out []warmpool.Instance
	for _, i := range in {
		if !i.Ready && n > 0 {
			n--
			continue
		}
		out = append(out, i)
	}
	return out
}

// grow creates the instances the plan asks for, under the capacity lock:
// the plan is made again there with the free capacity and the line as
// they are then.
func (u *Usher) grow(ctx context.Context, lab labs.Lab, c Capacity, in warmpool.Input, rep *PoolReport) error {
	unlock, _, err := u.lock(ctx, "", nil)
	if err != nil {
		return fmt.Errorf("capacity lock: %w", err)
	}
	defer unlock()
	used, err := u.count(ctx, c.Kind)
	if err != nil {
		return err
	}
	if in.Waiting, err = u.waiting(ctx, c.Kind); err != nil {
		return err
	}
	held, err := u.held(ctx, c.Kind)
	if err != nil {
		return err
	}
	// Seats reservations hold are not the pool's to take.
	in.Free = 0
	if c.Need > 0 {
		in.Free = max(c.Limit-used-held, 0) / c.Need
	}
	live, err := u.store.ListLive(ctx)
	if err != nil {
		return err
	}
	in.Instances = poolInstances(live, lab.Name)
	d := warmpool.Plan(in)
	for range d.Create {
		if err := u.createInstance(ctx, lab, reservation.Hold{}); err != nil {
			return err
		}
		rep.Created++
	}
	return nil
}

// createInstance writes a pool instance's row and creates its objects
// (called under the capacity lock): the general pool's, or, when class
// has an ID, one held for that reservation's members. Its window is the
// TTL, or the class's until its seats are released: the reaper expires
// an instance nobody claimed even if no maintenance runs.
func (u *Usher) createInstance(ctx context.Context, lab labs.Lab, class reservation.Hold) error {
	sess, err := u.rows.New(uuid.NewString(), PoolStudent, lab, "")
	if err != nil {
		return err
	}
	// Pool instances authorize no student: the generated pair is dropped.
	sess.StudentKey, sess.Issued.StudentPrivateKey = "", ""
	sess.Pool = session.PoolIdle
	sess.ExpiresAt = sess.StartedAt.Add(u.pool.TTL)
	if class.ID != 0 {
		sess.Reservation, sess.ExpiresAt = class.ID, u.rules.HeldUntil(class)
	}
	sess.MaxExpiresAt = sess.ExpiresAt
	if err := u.store.Create(ctx, sess); err != nil {
		return err
	}
	log := u.log.With("session", sess.ID, "lab", lab.Name)
	if err := u.cluster.Provision(ctx, sess, lab); err != nil {
		_, _ = u.rows.Rollback(ctx, log, sess, fmt.Errorf("%w: warm pool instance: %w", session.ErrProvisioning, err), true)
		return err
	}
	log.Info("warm pool instance created")
	return nil
}

// poolInstances are the unclaimed instances of lab's general pool (held
// for no reservation) among rows, as the plan sees them.
func poolInstances(rows []session.Session, lab string) []warmpool.Instance {
	return classInstances(rows, lab, 0)
}

// classInstances are the unclaimed instances of lab held for reservation
// class (0: the general pool's) among rows.
func classInstances(rows []session.Session, lab string, class int64) []warmpool.Instance {
	var out []warmpool.Instance
	for _, l := range rows {
		if l.Pool == session.PoolIdle && l.Lab == lab && l.Reservation == class {
			out = append(out, warmpool.Instance{ID: l.ID, Lab: l.Lab, CreatedAt: l.StartedAt, Ready: l.Status == session.StatusRunning})
		}
	}
	return out
}
