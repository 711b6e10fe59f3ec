package seating

import (
	"context"
	"errors"
	"fmt"
	"labkeep/shared/line"
	"time"

	"labkeep/shared/labs"
	"labkeep/shared/session"
)

// The waitlist. At capacity an open that asked to wait (session's OpenWaiting) is
// not refused: the student gets an Entry and keeps it by polling (Get).
// Each capacity bucket (VMs, workspace Pods) has its own line, strictly
// first come, first served (arrival order is the database's, never the
// client's): nobody is served while someone who came earlier still waits
// for the same bucket, and an open without waiting is refused while anyone
// waits for its bucket, so retrying never jumps the line. When
// capacity frees, the head of the line is turned into a provisioning
// session at once, by whoever freed it (a close, a failed open) and by the
// reaper as a backstop (ServeWaitlist); both hold the capacity lock, and
// the entry becomes the session in one transaction, so nobody is served
// twice.

// Entry is one student waiting in the line.
type Entry struct {
	// ID is the id the session gets when the entry is served.
	ID      string
	Student string
	Lab     string
	// StudentKey is the public key the student logs in with (theirs, or
	// the one generated when they joined: its private half was in the
	// answer to that open).
	StudentKey string
	// Seq is the arrival order, given by the database.
	Seq        int64
	EnqueuedAt time.Time
	// PolledAt is the entry's last sign of life (the join, a poll, a
	// repeated open).
	PolledAt time.Time
}

// Waitlist is the database of the line. Every method is atomic.
type Waitlist interface {
	// Enqueue appends e behind everyone and deletes the provisioning row
	// with e.ID (the open that found no capacity, which has no objects),
	// in one transaction. If the student already waits, nothing changes
	// and their entry is returned with session.ErrSessionExists.
	Enqueue(ctx context.Context, e Entry) (Entry, error)
	// Line is every entry, in arrival order.
	Line(ctx context.Context) ([]Entry, error)
	// Touch records a sign of life of the student's entry at at and
	// returns it, if it had one since since (zero: whenever);
	// session.ErrNoSession if the student does not wait or their entry
	// went idle before since (an idle entry is never revived: it is
	// dropped before anyone counts the line).
	Touch(ctx context.Context, student string, at, since time.Time) (Entry, error)
	// Leave removes the student's entry and returns it; session.ErrNoSession if
	// the student does not wait.
	Leave(ctx context.Context, student string) (Entry, error)
	// DropIdle removes the entries with no sign of life since before and
	// returns them.
	DropIdle(ctx context.Context, before time.Time) ([]Entry, error)
	// Promote turns the entry with s.ID into the session row s
	// (provisioning) in one transaction; session.ErrNoSession if the entry is gone
	// (served or left meanwhile), session.ErrSessionExists if the student has a
	// live session.
	Promote(ctx context.Context, s session.Session) error
	// RecentlyEnded is at most limit sessions that ended after since, the
	// latest first (for the ETA's early-close share).
	RecentlyEnded(ctx context.Context, since time.Time, limit int) ([]session.Session, error)
}

// DefaultQueueIdle is how long an entry nobody polls keeps its place.
const DefaultQueueIdle = 2 * time.Minute

// reapLag is how long after a session's expiry its capacity may still be
// held: the reaper runs once a minute and a run takes less than a minute.
const reapLag = 2 * time.Minute

// earlySample bounds the ended sessions the early-close share is taken
// from: at most so many, ended within earlyWindow.
const (
	earlySample = 200
	earlyWindow = 24 * time.Hour
)

// Queued implements session.Seating: the student's entry with its place,
// after a sign of life; session.ErrNoSession if they do not wait, or
// their entry went idle (Limits.QueueIdle) before this poll. Idle entries
// of others are then dropped, so the place is current. A student who does
// not wait costs one query: every poll of a running session asks.
func (u *Usher) Queued(ctx context.Context, student string) (line.Waiting, error) {
	if u.waitlist == nil {
		return line.Waiting{}, session.ErrNoSession
	}
	now := u.now()
	e, err := u.waitlist.Touch(ctx, student, now, now.Add(-u.limits.QueueIdle))
	if err != nil {
		return line.Waiting{}, err
	}
	u.dropIdle(ctx)
	w, err := u.placeOf(ctx, e)
	if err != nil || w.Place.Position != 1 || w.Place.ETA > 0 {
		return w, err
	}
	// The head, with room by the database's count: the cluster may only
	// now have let go of what a finished session held (a Pod or VM
	// terminates gracefully after its delete), so the head's own poll
	// serves the line. If it was served, ErrNoSession sends the caller to
	// the session.
	u.Freed(ctx)
	if e, err = u.waitlist.Touch(ctx, student, u.now(), time.Time{}); err != nil {
		return line.Waiting{}, err
	}
	return u.placeOf(ctx, e)
}

// dropIdle removes the entries nobody polled within Limits.QueueIdle and,
// if any went, serves the line (the head may have been one of them).
func (u *Usher) dropIdle(ctx context.Context) {
	dropped, err := u.dropIdleEntries(ctx)
	if err != nil {
		u.log.Warn("cannot drop idle waitlist entries", "err", err)
		return
	}
	if len(dropped) > 0 {
		u.Freed(ctx)
	}
}

// dropIdleEntries removes the entries nobody polled within
// Limits.QueueIdle, logs and counts each, and returns them.
func (u *Usher) dropIdleEntries(ctx context.Context) ([]Entry, error) {
	dropped, err := u.waitlist.DropIdle(ctx, u.now().Add(-u.limits.QueueIdle))
	for _, e := range dropped {
		u.log.Info("waitlist entry dropped: nobody polled it", "session", e.ID, "student", e.Student, "idle", u.limits.QueueIdle)
		u.metrics.QueueEvent(e.Lab, QueueDropped)
	}
	return dropped, err
}

// placeOf is the view of e (line.Waiting) with its position and ETA in
// the line of its capacity bucket.
func (u *Usher) placeOf(ctx context.Context, e Entry) (line.Waiting, error) {
	w := line.Waiting{ID: e.ID, Student: e.Student, Lab: e.Lab, StudentKey: e.StudentKey, JoinedAt: e.EnqueuedAt}
	mine, ok := u.capacityOf(e.Lab)
	if !ok {
		return w, fmt.Errorf("%w: lab %s left the catalog", session.ErrNoSession, e.Lab)
	}
	w.Kind = mine.Kind
	entries, err := u.waitlist.Line(ctx)
	if err != nil {
		return w, err
	}
	live, err := u.store.ListLive(ctx)
	if err != nil {
		return w, err
	}
	now := u.now()
	ended, err := u.waitlist.RecentlyEnded(ctx, now.Add(-earlyWindow), earlySample)
	if err != nil {
		return w, err
	}
	share := EarlyCloseShare(ended)
	in := ETAInput{Now: now, Capacity: mine.Limit, Lag: reapLag,
		Likely: time.Duration(float64(u.rows.Policy.Lifetime) * (1 - share)), Latest: u.rows.Policy.MaxLifetime}
	for _, l := range live {
		if c, ok := u.capacityOf(l.Lab); ok && c.Kind == mine.Kind {
			in.Live = append(in.Live, HoldingOf(l, c.Need, share, now))
		}
	}
	if u.booked != nil {
		// The line waits for seats reservations hold, and for those they
		// will hold before the latest wait is over.
		holds, uses, err := u.booked.Holding(ctx, now, now.Add(u.rows.Policy.MaxLifetime+u.rules.Lead))
		if err != nil {
			return w, fmt.Errorf("reading the reservations: %w", err)
		}
		in.Live = append(in.Live, ReservedHoldings(now, holds, uses, mine.Kind, u.rules)...)
	}
	pos := 0
	for _, other := range entries {
		c, ok := u.capacityOf(other.Lab)
		if !ok || c.Kind != mine.Kind {
			continue
		}
		in.Waiting = append(in.Waiting, c.Need)
		if other.ID == e.ID {
			pos = len(in.Waiting)
			break
		}
	}
	if pos == 0 {
		return w, fmt.Errorf("%w: %s is no longer in the line", session.ErrNoSession, e.Student)
	}
	eta := QueueETAs(in)[pos-1]
	w.Place = line.Place{Position: pos, ETA: eta.Likely, ETALatest: eta.Latest}
	return w, nil
}

// capacityOf is what a session of the named lab takes from its bucket;
// each bucket has a line of its own, so a student waiting for a workspace
// Pod never waits behind one waiting for VMs. False if the lab has left
// the catalog.
func (u *Usher) capacityOf(labName string) (Capacity, bool) {
	lab, ok := u.labs.Get(labName)
	if !ok {
		return Capacity{}, false
	}
	return CapacityOf(lab, u.limits), true
}

// waiting is how many students wait in the line of kind's bucket (after
// dropping the idle entries); 0 without a Waitlist.
func (u *Usher) waiting(ctx context.Context, kind labs.Kind) (int, error) {
	if u.waitlist == nil {
		return 0, nil
	}
	if _, err := u.dropIdleEntries(ctx); err != nil {
		return 0, err
	}
	line, err := u.waitlist.Line(ctx)
	n := 0
	for _, e := range line {
		if c, ok := u.capacityOf(e.Lab); ok && c.Kind == kind {
			n++
		}
	}
	return n, err
}

// Leave implements session.Seating: it takes the student out of the line
// (closeSession while queued); id, if non-empty, must be their entry's.
// session.ErrNoSession if they do not wait.
func (u *Usher) Leave(ctx context.Context, student, id string, actor session.Actor, by string) (session.Session, error) {
	if u.waitlist == nil {
		return session.Session{}, session.ErrNoSession
	}
	if id != "" {
		e, err := u.waitlist.Touch(ctx, student, u.now(), time.Time{})
		if err != nil {
			return session.Session{}, err
		}
		if e.ID != id {
			return session.Session{}, fmt.Errorf("%w: no queued session %s for this student", session.ErrNoSession, id)
		}
	}
	e, err := u.waitlist.Leave(ctx, student)
	if err != nil {
		return session.Session{}, err
	}
	u.log.Info("left the waitlist", "session", e.ID, "student", student, "by", by)
	u.metrics.QueueEvent(e.Lab, QueueLeft)
	u.Freed(ctx)
	return session.Session{ID: e.ID, Student: e.Student, Lab: e.Lab, Status: session.StatusClosed, StudentKey: e.StudentKey,
		FinishedAt: u.now(),
		End:        session.EndReason{Kind: session.EndClosed, Actor: actor, Detail: "left the waitlist: closed by " + string(actor) + " " + by}}, nil
}

// enqueue puts the open's row sess into the line (called under the
// capacity lock, so no capacity can free unseen between the count and the
// join) and returns the student's place: their earlier entry's if they
// already waited.
func (u *Usher) enqueue(ctx context.Context, sess session.Session) (line.Waiting, error) {
	now := u.now()
	e, err := u.waitlist.Enqueue(ctx, Entry{ID: sess.ID, Student: sess.Student, Lab: sess.Lab,
		StudentKey: sess.StudentKey, EnqueuedAt: now, PolledAt: now})
	if err != nil && !errors.Is(err, session.ErrSessionExists) {
		return line.Waiting{}, err
	}
	if err == nil {
		u.metrics.QueueEvent(e.Lab, QueueJoined)
	}
	u.log.Info("joined the waitlist", "session", e.ID, "student", e.Student, "lab", e.Lab, "seq", e.Seq)
	return u.placeOf(ctx, e)
}

// ServeWaitlist provisions the head of each bucket's line while its
// capacity allows, strictly in arrival order (a head that does not fit
// blocks everyone behind it in its bucket), and returns how many it served.
// Each round holds the capacity lock from the count to the last create,
// and turns an entry into its session row in one transaction, so
// concurrent servers (a close, the reaper) never serve one entry twice nor
// overshoot a limit. The reaper calls it every run as a backstop;
// everything that frees capacity calls it at once (and so waits for the
// capacity lock when someone waits).
func (u *Usher) ServeWaitlist(ctx context.Context) (served int, err error) {
	// Capacity may have been freed: no count made before refuses anyone.
	u.counts.forget()
	if u.waitlist == nil {
		return 0, nil
	}
	// Nobody waits (the usual case): no need to queue for the capacity
	// lock, which an open may hold for as long as its creates take.
	if line, err := u.waitlist.Line(ctx); err != nil || len(line) == 0 {
		return 0, err
	}
	for {
		n, again, err := u.serveRound(ctx)
		served += n
		if err != nil || !again {
			return served, err
		}
	}
}

// serveRound serves, under one hold of the capacity lock, the head of
// every bucket's line that fits, and drops heads whose lab left the
// catalog; again reports that the line changed, so another round may
// serve more.
func (u *Usher) serveRound(ctx context.Context) (served int, again bool, err error) {
	unlock, _, err := u.lock(ctx, "", nil)
	if err != nil {
		return 0, false, fmt.Errorf("capacity lock: %w", err)
	}
	defer unlock()
	if _, err := u.dropIdleEntries(ctx); err != nil {
		return 0, false, err
	}
	line, err := u.waitlist.Line(ctx)
	if err != nil {
		return 0, false, err
	}
	seen := map[labs.Kind]bool{}
	for _, head := range line {
		lab, ok := u.labs.Get(head.Lab)
		if !ok {
			if _, err := u.waitlist.Leave(ctx, head.Student); err != nil {
				return served, false, err
			}
			u.log.Warn("waitlist entry dropped: its lab left the catalog", "session", head.ID, "lab", head.Lab)
			u.metrics.QueueEvent(head.Lab, QueueDropped)
			again = true
			continue
		}
		c := CapacityOf(lab, u.limits)
		if seen[c.Kind] {
			continue // not the head of its bucket's line
		}
		seen[c.Kind] = true
		ok, err := u.serveEntry(ctx, head, lab, c)
		if err != nil {
			return served, false, err
		}
		if ok {
			served++
			again = true
		}
	}
	return served, again, nil
}

// serveEntry turns the head of a bucket's line into a provisioning session
// and creates its objects, if its bucket has room (called under the
// capacity lock). ok reports that the entry left the line (served, even
// if its provisioning then failed and was rolled back, or gone already).
func (u *Usher) serveEntry(ctx context.Context, head Entry, lab labs.Lab, c Capacity) (ok bool, err error) {
	// The head waits for nobody: a ready warm instance serves it without
	// new capacity, else it needs room in its bucket.
	in := Input{Lab: lab.Name, Capacity: c, Warm: u.warm(lab, false), Wait: true}
	if Decide(in).Verdict == Claim {
		if claimed, ok := u.claim(ctx, session.Session{ID: head.ID, Student: head.Student, StudentKey: head.StudentKey}, lab, 0, 0); ok {
			u.metrics.QueueEvent(lab.Name, QueueServed)
			u.log.Info("served from the waitlist by the warm pool", "session", claimed.ID, "student", head.Student, "waited", u.now().Sub(head.EnqueuedAt))
			return true, nil
		}
		in.Warm = false
	}
	if in.Used, err = u.count(ctx, c.Kind); err != nil {
		return false, err
	}
	if in.Reserved, err = u.held(ctx, c.Kind); err != nil {
		return false, err
	}
	if Decide(in).Verdict != Cold {
		return false, nil
	}
	sess, err := u.rows.New(head.ID, head.Student, lab, head.StudentKey)
	if err != nil {
		return false, err
	}
	if lab.Home != nil {
		// The row names the home it holds, as an open's does: it is in
		// use from now on, and it is the student's.
		if u.homes == nil {
			return false, fmt.Errorf("lab %s keeps a home, and this usher keeps none", lab.Name)
		}
		if sess.Home, err = u.homes.HomeFor(ctx, head.Student, lab); err != nil {
			return false, err
		}
	}
	switch err := u.waitlist.Promote(ctx, sess); {
	case errors.Is(err, session.ErrNoSession):
		return true, nil // served or left meanwhile
	case errors.Is(err, session.ErrSessionExists):
		_, err := u.waitlist.Leave(ctx, head.Student)
		return err == nil, err
	case err != nil:
		return false, err
	}
	u.metrics.QueueEvent(lab.Name, QueueServed)
	log := u.log.With("session", sess.ID, "lab", lab.Name)
	log.Info("served from the waitlist", "student", sess.Student, "waited", sess.StartedAt.Sub(head.EnqueuedAt))
	if err := u.cluster.Provision(ctx, sess, lab); err != nil {
		kind := session.ErrProvisioning
		if errors.Is(err, session.ErrNoCapacity) {
			kind = session.ErrNoCapacity
		}
		_, _ = u.rows.Rollback(ctx, log, sess, fmt.Errorf("%w: %w", kind, err), true)
		return true, nil
	}
	if _, err := u.rows.ConfirmLive(ctx, sess.ID); err != nil {
		_, _ = u.rows.Abandon(ctx, log, sess, err, true)
	}
	return true, nil
}
