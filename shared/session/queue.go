package session

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"labkeep/shared/labs"
)

// The waitlist. At capacity an open that asked to wait (OpenWaiting) is
// not refused: the student gets an Entry and keeps it by polling (Get).
// Each capacity pool (VMs, workspace Pods) has its own line, strictly
// first come, first served (arrival order is the database's, never the
// client's): nobody is served while someone who came earlier still waits
// for the same pool, and an open without waiting is refused while anyone
// waits for its pool, so retrying never jumps the line. When
// capacity frees, the head of the line is turned into a provisioning
// session at once, by whoever freed it (a close, a failed open) and by the
// reaper as a backstop (ServeWaitlist); both hold the capacity lock, and
// the entry becomes the session in one transaction, so nobody is served
// twice.

// StatusQueued is the status of a student waiting in the line. It is
// never stored in a session row: a queued Session is read from its Entry.
const StatusQueued Status = "queued"

// Place is where a queued session stands; zero for any other session.
type Place struct {
	// Position is 1 for the head of the line.
	Position int
	// ETA is the likely wait until the session starts provisioning;
	// ETALatest the longest it can take (see QueueETAs).
	ETA, ETALatest time.Duration
}

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
	// and their entry is returned with ErrSessionExists.
	Enqueue(ctx context.Context, e Entry) (Entry, error)
	// Line is every entry, in arrival order.
	Line(ctx context.Context) ([]Entry, error)
	// Touch records a sign of life of the student's entry at at and
	// returns it; ErrNoSession if the student does not wait.
	Touch(ctx context.Context, student string, at time.Time) (Entry, error)
	// Leave removes the student's entry and returns it; ErrNoSession if
	// the student does not wait.
	Leave(ctx context.Context, student string) (Entry, error)
	// DropIdle removes the entries with no sign of life since before and
	// returns them.
	DropIdle(ctx context.Context, before time.Time) ([]Entry, error)
	// Promote turns the entry with s.ID into the session row s
	// (provisioning) in one transaction; ErrNoSession if the entry is gone
	// (served or left meanwhile), ErrSessionExists if the student has a
	// live session.
	Promote(ctx context.Context, s Session) error
	// RecentlyEnded is at most limit sessions that ended after since, the
	// latest first (for the ETA's early-close share).
	RecentlyEnded(ctx context.Context, since time.Time, limit int) ([]Session, error)
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

// OpenWaiting is Open for a student willing to wait: where Open would
// refuse with ErrNoCapacity because the VM limit is reached (or someone
// already waits), the student joins the line instead and gets a Session
// with StatusQueued and its Place (the generated private key, if any, is
// in Issued, as with Open). A student already in the line gets their entry
// and place back, unchanged. Without a Waitlist it is Open.
func (s *Service) OpenWaiting(ctx context.Context, student, labName, publicKey string) (Session, error) {
	return s.open(ctx, student, labName, publicKey, true)
}

// queued returns the student's entry as a queued Session with its place,
// after a sign of life (touch) if asked; ErrNoSession if they do not wait.
// Idle entries of others are dropped first, so the place is current.
func (s *Service) queued(ctx context.Context, student string) (Session, error) {
	if s.Waitlist == nil {
		return Session{}, ErrNoSession
	}
	s.dropIdle(ctx)
	e, err := s.Waitlist.Touch(ctx, student, s.now())
	if err != nil {
		return Session{}, err
	}
	q, err := s.placeOf(ctx, e)
	if err != nil || q.Queue.Position != 1 || q.Queue.ETA > 0 {
		return q, err
	}
	// The head, with room by the database's count: the cluster may only
	// now have let go of what a finished session held (a Pod or VM
	// terminates gracefully after its delete), so the head's own poll
	// serves the line. If it was served, ErrNoSession sends the caller to
	// the session.
	s.serveDetached(ctx)
	if e, err = s.Waitlist.Touch(ctx, student, s.now()); err != nil {
		return Session{}, err
	}
	return s.placeOf(ctx, e)
}

// dropIdle removes the entries nobody polled within Limits.QueueIdle and,
// if any went, serves the line (the head may have been one of them).
func (s *Service) dropIdle(ctx context.Context) {
	dropped, err := s.dropIdleEntries(ctx)
	if err != nil {
		s.Log.Warn("cannot drop idle waitlist entries", "err", err)
		return
	}
	if len(dropped) > 0 {
		s.serveDetached(ctx)
	}
}

// dropIdleEntries removes the entries nobody polled within
// Limits.QueueIdle, logs and counts each, and returns them.
func (s *Service) dropIdleEntries(ctx context.Context) ([]Entry, error) {
	dropped, err := s.Waitlist.DropIdle(ctx, s.now().Add(-s.Limits.QueueIdle))
	for _, e := range dropped {
		s.Log.Info("waitlist entry dropped: nobody polled it", "session", e.ID, "student", e.Student, "idle", s.Limits.QueueIdle)
		s.Metrics.queueEvent(e.Lab, QueueDropped)
	}
	return dropped, err
}

// placeOf renders e as a queued Session with its position and ETA in
// the line of its capacity pool.
func (s *Service) placeOf(ctx context.Context, e Entry) (Session, error) {
	sess := Session{ID: e.ID, Student: e.Student, Lab: e.Lab, Status: StatusQueued, StudentKey: e.StudentKey}
	sess.StartedAt = e.EnqueuedAt
	pool, ok := s.poolOf(e.Lab)
	if !ok {
		return sess, fmt.Errorf("%w: lab %s left the catalog", ErrNoSession, e.Lab)
	}
	sess.Kind = pool.kind
	line, err := s.Waitlist.Line(ctx)
	if err != nil {
		return sess, err
	}
	live, err := s.Store.ListLive(ctx)
	if err != nil {
		return sess, err
	}
	now := s.now()
	ended, err := s.Waitlist.RecentlyEnded(ctx, now.Add(-earlyWindow), earlySample)
	if err != nil {
		return sess, err
	}
	share := EarlyCloseShare(ended)
	in := ETAInput{Now: now, Capacity: pool.limit, Lag: reapLag,
		Likely: time.Duration(float64(s.Policy.Lifetime) * (1 - share)), Latest: s.Policy.MaxLifetime}
	for _, l := range live {
		if c, ok := s.poolOf(l.Lab); ok && c.what == pool.what {
			in.Live = append(in.Live, HoldingOf(l, c.need, share, now))
		}
	}
	pos := 0
	for _, w := range line {
		c, ok := s.poolOf(w.Lab)
		if !ok || c.what != pool.what {
			continue
		}
		in.Waiting = append(in.Waiting, c.need)
		if w.ID == e.ID {
			pos = len(in.Waiting)
			break
		}
	}
	if pos == 0 {
		return sess, fmt.Errorf("%w: %s is no longer in the line", ErrNoSession, e.Student)
	}
	eta := QueueETAs(in)[pos-1]
	sess.Queue = Place{Position: pos, ETA: eta.Likely, ETALatest: eta.Latest}
	return sess, nil
}

// pool is a capacity pool (VMs, workspace Pods) with the kind of lab it
// serves: each pool has a line of its own, so a student waiting for a
// workspace Pod never waits behind one waiting for VMs.
type pool struct {
	capacity
	kind labs.Kind
}

// poolOf is the pool a session of the named lab takes capacity from;
// false if the lab has left the catalog.
func (s *Service) poolOf(labName string) (pool, bool) {
	lab, ok := s.Labs.Get(labName)
	if !ok {
		return pool{}, false
	}
	return pool{s.capacityFor(lab), lab.Kind}, true
}

// waiting is how many students wait in the line of the pool named what
// (after dropping the idle entries); 0 without a Waitlist.
func (s *Service) waiting(ctx context.Context, what string) (int, error) {
	if s.Waitlist == nil {
		return 0, nil
	}
	if _, err := s.dropIdleEntries(ctx); err != nil {
		return 0, err
	}
	line, err := s.Waitlist.Line(ctx)
	n := 0
	for _, e := range line {
		if c, ok := s.poolOf(e.Lab); ok && c.what == what {
			n++
		}
	}
	return n, err
}

// leave takes the student out of the line (closeSession while queued);
// id, if non-empty, must be their entry's. ErrNoSession if they do not
// wait.
func (s *Service) leave(ctx context.Context, student, id string, actor Actor, by string) (Session, error) {
	if s.Waitlist == nil {
		return Session{}, ErrNoSession
	}
	if id != "" {
		e, err := s.Waitlist.Touch(ctx, student, s.now())
		if err != nil {
			return Session{}, err
		}
		if e.ID != id {
			return Session{}, fmt.Errorf("%w: no queued session %s for this student", ErrNoSession, id)
		}
	}
	e, err := s.Waitlist.Leave(ctx, student)
	if err != nil {
		return Session{}, err
	}
	s.Log.Info("left the waitlist", "session", e.ID, "student", student, "by", by)
	s.Metrics.queueEvent(e.Lab, QueueLeft)
	s.serveDetached(ctx)
	return Session{ID: e.ID, Student: e.Student, Lab: e.Lab, Status: StatusClosed, StudentKey: e.StudentKey,
		FinishedAt: s.now(),
		End:        EndReason{Kind: EndClosed, Actor: actor, Detail: "left the waitlist: closed by " + string(actor) + " " + by}}, nil
}

// enqueue puts the open's row sess into the line (called under the
// capacity lock, so no capacity can free unseen between the count and the
// join).
func (s *Service) enqueue(ctx context.Context, sess Session) (Session, error) {
	now := s.now()
	e, err := s.Waitlist.Enqueue(ctx, Entry{ID: sess.ID, Student: sess.Student, Lab: sess.Lab,
		StudentKey: sess.StudentKey, EnqueuedAt: now, PolledAt: now})
	if err != nil && !errors.Is(err, ErrSessionExists) {
		return Session{}, err
	}
	if err == nil {
		s.Metrics.queueEvent(e.Lab, QueueJoined)
	}
	s.Log.Info("joined the waitlist", "session", e.ID, "student", e.Student, "lab", e.Lab, "seq", e.Seq)
	return s.placeOf(ctx, e)
}

// serveDetached serves the line on a context that outlives the caller's
// request (capacity freed by a request must be handed on even if its
// client has gone).
func (s *Service) serveDetached(ctx context.Context) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.Limits.CapacityWait+s.Limits.CleanupTimeout)
	defer cancel()
	if _, err := s.ServeWaitlist(cctx); err != nil {
		s.Log.Warn("cannot serve the waitlist; the reaper will", "err", err)
	}
}

// ServeWaitlist provisions the head of each pool's line while its
// capacity allows, strictly in arrival order (a head that does not fit
// blocks everyone behind it in its pool), and returns how many it served.
// Each round holds the capacity lock from the count to the last create,
// and turns an entry into its session row in one transaction, so
// concurrent servers (a close, the reaper) never serve one entry twice nor
// overshoot a limit. The reaper calls it every run as a backstop;
// everything that frees capacity calls it at once (and so waits for the
// capacity lock when someone waits).
func (s *Service) ServeWaitlist(ctx context.Context) (served int, err error) {
	if s.Waitlist == nil {
		return 0, nil
	}
	// Nobody waits (the usual case): no need to queue for the capacity
	// lock, which an open may hold for as long as its creates take.
	if line, err := s.Waitlist.Line(ctx); err != nil || len(line) == 0 {
		return 0, err
	}
	for {
		n, again, err := s.serveRound(ctx)
		served += n
		if err != nil || !again {
			return served, err
		}
	}
}

// serveRound serves, under one hold of the capacity lock, the head of
// every pool's line that fits, and drops heads whose lab left the
// catalog; again reports that the line changed, so another round may
// serve more.
func (s *Service) serveRound(ctx context.Context) (served int, again bool, err error) {
	lctx, cancel := context.WithTimeout(ctx, s.Limits.CapacityWait)
	unlock, err := s.Store.LockCapacity(lctx)
	cancel()
	if err != nil {
		return 0, false, fmt.Errorf("capacity lock: %w", err)
	}
	defer unlock()
	if _, err := s.dropIdleEntries(ctx); err != nil {
		return 0, false, err
	}
	line, err := s.Waitlist.Line(ctx)
	if err != nil {
		return 0, false, err
	}
	seen := map[string]bool{}
	for _, head := range line {
		lab, ok := s.Labs.Get(head.Lab)
		if !ok {
			if _, err := s.Waitlist.Leave(ctx, head.Student); err != nil {
				return served, false, err
			}
			s.Log.Warn("waitlist entry dropped: its lab left the catalog", "session", head.ID, "lab", head.Lab)
			s.Metrics.queueEvent(head.Lab, QueueDropped)
			again = true
			continue
		}
		c := s.capacityFor(lab)
		if seen[c.what] {
			continue // not the head of its pool's line
		}
		seen[c.what] = true
		ok, err := s.serveEntry(ctx, head, lab, c)
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

// serveEntry turns the head of a pool's line into a provisioning session
// and creates its objects, if its pool has room (called under the
// capacity lock). ok reports that the entry left the line (served, even
// if its provisioning then failed and was rolled back, or gone already).
func (s *Service) serveEntry(ctx context.Context, head Entry, lab labs.Lab, c capacity) (ok bool, err error) {
	// A ready pool instance serves the head without new capacity.
	if claimed, ok := s.claimPooled(ctx, Session{ID: head.ID, Student: head.Student, StudentKey: head.StudentKey}, lab); ok {
		s.Metrics.queueEvent(lab.Name, QueueServed)
		s.Log.Info("served from the waitlist by the warm pool", "session", claimed.ID, "student", head.Student, "waited", s.now().Sub(head.EnqueuedAt))
		return true, nil
	}
	used, err := c.count(ctx)
	if err != nil {
		return false, err
	}
	if used+c.need > c.limit {
		return false, nil
	}
	sess, err := s.newSession(head.ID, head.Student, lab, head.StudentKey)
	if err != nil {
		return false, err
	}
	switch err := s.Waitlist.Promote(ctx, sess); {
	case errors.Is(err, ErrNoSession):
		return true, nil // served or left meanwhile
	case errors.Is(err, ErrSessionExists):
		_, err := s.Waitlist.Leave(ctx, head.Student)
		return err == nil, err
	case err != nil:
		return false, err
	}
	s.Metrics.queueEvent(lab.Name, QueueServed)
	log := s.Log.With("session", sess.ID, "lab", lab.Name)
	log.Info("served from the waitlist", "student", sess.Student, "waited", sess.StartedAt.Sub(head.EnqueuedAt))
	if err := s.Cluster.Provision(ctx, sess, lab); err != nil {
		kind := ErrProvisioning
		if errors.Is(err, ErrNoCapacity) {
			kind = ErrNoCapacity
		}
		_, _ = s.rollback(ctx, log, sess, fmt.Errorf("%w: %w", kind, err), true)
		return true, nil
	}
	if _, err := s.confirmLive(ctx, sess.ID); err != nil {
		_, _ = s.abandon(ctx, log, sess, err, true)
	}
	return true, nil
}

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
func EarlyCloseShare(ended []Session) float64 {
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
func HoldingOf(l Session, vms int, share float64, now time.Time) Holding {
	likely := l.ExpiresAt.Add(-time.Duration(share * float64(l.ExpiresAt.Sub(l.StartedAt))))
	if likely.Before(now) {
		likely = now
	}
	return Holding{VMs: vms, Likely: likely, Latest: l.MaxExpiresAt}
}

// newSession is a fresh provisioning row for student of lab with id, its
// own host key and grading token, its lifetime starting now; studentKey
// may be empty (a key pair is generated, its private half in Issued).
func (s *Service) newSession(id, student string, lab labs.Lab, studentKey string) (Session, error) {
	token, err := newToken()
	if err != nil {
		return Session{}, err
	}
	sess := Session{
		ID:           id,
		Student:      student,
		Lab:          lab.Name,
		Kind:         lab.Kind,
		Status:       StatusProvisioning,
		Window:       s.Policy.Open(s.now()),
		GradingToken: token,
	}
	for _, n := range lab.Nodes {
		sess.Nodes = append(sess.Nodes, Node{Name: n.Name, Role: n.Role, SSHPort: lab.SSHPort})
	}
	if err := issueKeys(&sess, studentKey); err != nil {
		return Session{}, err
	}
	return sess, nil
}
