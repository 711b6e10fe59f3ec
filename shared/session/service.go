package session

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"labkeep/shared/labs"
	"labkeep/shared/lifetime"
)

// Service implements openSession, extendSession, getSession and
// closeSession. It holds no state between calls, so any number of
// instances (Knative pods, Lambda invocations) can serve at once. Whether
// an open may take capacity is Seating's decision; Service keeps the life
// of the one session it is asked about.
type Service struct {
	*Starter
	Labs Catalog
	// Seating admits opens to the shared capacity (the capacity lock, the
	// waitlist, the warm pool) and hands capacity a session frees to the
	// line.
	Seating Seating
	// Homes is asked before an open of a lab that keeps a home writes its
	// row (HomeFor). Nil: labs that keep a home cannot be opened.
	Homes Homes
	// OpenRate bounds the opens a student makes that write a row; zero:
	// no bound (DefaultOpenRate is the deployed default).
	OpenRate OpenRate
}

// Catalog is where Open looks labs up: a *labs.Live re-read while the
// functions run, or a fixed *labs.Catalog. Only Open reads it: a session
// stores its kind and nodes, so extend, close and teardown never depend on
// the catalog in force.
type Catalog interface {
	Get(name string) (labs.Lab, bool)
	Names() []string
}

// Catalog is the lab catalog opens are checked against (Labs).
func (s *Service) Catalog() Catalog { return s.Labs }

// ListLive is every live session, unclaimed warm-pool instances included,
// oldest first (Store.ListLive), each provisioning one refreshed from the
// cluster as Get does (Refresh), so its nodes' phases, a node the cluster
// cannot place among them, are current. Admission caps the live sessions,
// so the cluster reads are bounded by the capacity.
func (s *Service) ListLive(ctx context.Context) ([]Session, error) {
	live, err := s.Store.ListLive(ctx)
	if err != nil {
		return nil, err
	}
	for i := range live {
		live[i] = s.Refresh(ctx, live[i])
	}
	return live, nil
}

// ErrEndedWhileProvisioning is returned by Open when the session's row was
// finished by someone else (the student's close, an admin, the reaper)
// while Open was still queued or creating objects. Whatever Open created
// has been deleted; the row keeps the status the other party gave it.
var ErrEndedWhileProvisioning = fmt.Errorf("%w: session was ended while it was being provisioned", ErrProvisioning)

// Open starts a session of lab for student and returns it in
// Standing.Session (provisioning; poll Get until running). The session
// gets its own SSH host key, and the student logs in with publicKey (one
// authorized_keys line) or, if it is empty, with a key pair generated
// here: its private half is in the returned session's Issued, the only
// time anyone sees it. A student already in the line gets their place
// back in Standing.Waiting, unchanged: a repeated open is a poll, never a
// second entry, with or without waiting. Returns:
//   - ErrInvalidKey, saying what is wrong with publicKey;
//   - ErrUnknownLab, listing the valid labs;
//   - ErrSessionExists together with the student's live session (unless
//     that session has expired: then it is reclaimed and the open goes on);
//   - ErrNoCapacity when the VM limit or the cluster quota is reached;
//   - ErrProvisioning when the cluster refused for another reason;
//   - ErrEndedWhileProvisioning (an ErrProvisioning) when the row was
//     finished by a close or the reaper while the open was queued for
//     capacity or creating objects: what it created is deleted, and the
//     open never reports success for a row that is no longer live.
//
// On ErrNoCapacity and ErrProvisioning, everything already created is
// deleted and the row ends failed with the reason, so the student can
// retry at once; on ErrEndedWhileProvisioning the row keeps the final
// status its finisher gave it (closed, failed, expired). The row is
// written before any object exists, so a crash mid-way leaves a live row
// the reaper will find, never an object without a row.
func (s *Service) Open(ctx context.Context, student, labName, publicKey string, courses ...string) (_ Standing, err error) {
	defer func() { s.opened(labName, err) }()
	return s.open(ctx, student, labName, publicKey, false, courses)
}

// homeFor names the student's home for lab ("" when it keeps none), or
// refuses the open when Homes does (ErrHomeQuota) or when there is no
// Homes to keep it.
func (s *Service) homeFor(ctx context.Context, student string, lab labs.Lab) (string, error) {
	if lab.Home == nil {
		return "", nil
	}
	if s.Homes == nil {
		return "", fmt.Errorf("lab %s keeps a home, and this deployment keeps none", lab.Name)
	}
	return s.Homes.HomeFor(ctx, student, lab)
}

// rateAllows refuses with ErrTooManyOpens (wrapping the *rate.Exceeded)
// an open past the student's OpenRate; it is checked only for an open
// that would write a row.
func (s *Service) rateAllows(ctx context.Context, student string) error {
	if s.OpenRate.Max <= 0 {
		return nil
	}
	now := s.now()
	recent, err := s.Store.RecentOpens(ctx, student, s.OpenRate.Since(now), s.OpenRate.Max)
	if err != nil {
		return err
	}
	if err := s.OpenRate.Allow(recent, now); err != nil {
		return fmt.Errorf("%w: %w", ErrTooManyOpens, err)
	}
	return nil
}

// OpenWaiting is Open for a student willing to wait: where Open would
// refuse with ErrNoCapacity because the limit is reached (or someone
// already waits), the student joins the line instead and gets their place
// in Standing.Waiting (the generated private key, if any, is in its
// Issued, as with Open). A student already in the line gets their place
// back, unchanged. Without a line (see Seating) it is Open.
func (s *Service) OpenWaiting(ctx context.Context, student, labName, publicKey string, courses ...string) (Standing, error) {
	return s.open(ctx, student, labName, publicKey, true, courses)
}

func (s *Service) open(ctx context.Context, student, labName, publicKey string, wait bool, courses []string) (Standing, error) {
	lab, ok := s.Labs.Get(labName)
	if !ok {
		return Standing{}, fmt.Errorf("%w %q; valid labs: %s", ErrUnknownLab, labName, strings.Join(s.Labs.Names(), ", "))
	}
	var studentKey string
	if publicKey != "" {
		var err error
		if studentKey, err = NormalizeStudentKey(publicKey); err != nil {
			return Standing{}, err
		}
	}
	if live, err := s.Store.LiveFor(ctx, student); err == nil {
		if !s.reclaimExpired(ctx, live) {
			return Standing{Session: &live}, fmt.Errorf("%w: student already has session %s (%s)", ErrSessionExists, live.ID, live.Status)
		}
	} else if !errors.Is(err, ErrNoSession) {
		return Standing{}, err
	}
	// A student already in the line keeps their place: a repeated open
	// is a poll, never a second entry.
	if w, err := s.Seating.Queued(ctx, student); err == nil {
		return Standing{Waiting: &w}, nil
	} else if !errors.Is(err, ErrNoSession) {
		return Standing{}, err
	}
	if err := s.rateAllows(ctx, student); err != nil {
		return Standing{}, err
	}
	home, err := s.homeFor(ctx, student, lab)
	if err != nil {
		return Standing{}, err
	}
	sess, err := s.New(uuid.NewString(), student, lab, studentKey)
	if err != nil {
		return Standing{}, err
	}
	sess.Home, sess.Courses = home, courses
	if err := s.Store.Create(ctx, sess); err != nil {
		if errors.Is(err, ErrSessionExists) {
			live, gerr := s.Store.LiveFor(ctx, student)
			if gerr != nil {
				return Standing{}, err
			}
			return Standing{Session: &live}, fmt.Errorf("%w: student already has session %s (%s)", ErrSessionExists, live.ID, live.Status)
		}
		return Standing{}, err
	}
	log := s.Log.With("session", sess.ID, "lab", lab.Name)
	// The host private key stays in the cluster's Secret; only the
	// student's generated key is handed back, this once.
	issued := Issued{StudentPrivateKey: sess.Issued.StudentPrivateKey}
	started, placed, err := s.Seating.Seat(ctx, sess, lab, wait)
	if err == nil && placed.Session != nil { // claimed from the warm pool
		placed.Session.Issued = issued
		return placed, nil
	}
	if err == nil && placed.Waiting != nil {
		// The line may have room nobody has handed on yet (an idle head
		// was dropped just now): serve it, then answer with where the
		// student stands — still in line, or served already.
		s.Seating.Freed(ctx)
		if cur, err := s.Get(ctx, student, placed.Waiting.ID); err == nil {
			placed = cur
		}
		if placed.ID() == sess.ID { // not a place the student already had
			if placed.Session != nil {
				placed.Session.Issued = issued
			} else {
				placed.Waiting.StudentPrivateKey = issued.StudentPrivateKey
			}
		}
		return placed, nil
	}
	if errors.Is(err, ErrEndedWhileProvisioning) {
		defer s.Seating.Freed(ctx)
		return inSession(s.Abandon(ctx, log, sess, err, started))
	}
	if err != nil {
		if started {
			defer s.Seating.Freed(ctx)
		}
		return inSession(s.Rollback(ctx, log, sess, err, started))
	}
	// Someone may have finished the row while the objects were being
	// created (the reaper's ghost rule, a close). Checked under the row
	// lock, so a finisher in flight is waited for; after this point a
	// finisher's Teardown runs after every create and catches everything.
	cur, err := s.ConfirmLive(ctx, sess.ID)
	if err != nil {
		return inSession(s.Abandon(ctx, log, sess, err, true))
	}
	log.Info("session provisioned", "nodes", len(sess.Nodes))
	cur.Issued = issued
	return Standing{Session: &cur}, nil
}

// inSession is the Standing of a student whose open ended in sess (an
// unwound open's final row, returned with the error that ended it).
func inSession(sess Session, err error) (Standing, error) {
	return Standing{Session: &sess}, err
}

// reclaimExpired does the reaper's work for one session early: if live has
// expired (the same lifetime.Expired the reaper uses), its resources are
// deleted and then the row is marked expired, so a student whose time is up
// can open a new lab at once instead of waiting for the next reaper run.
// Reports whether the session is gone; on any failure it stays live for
// the reaper, exactly as the reaper would leave it.
func (s *Service) reclaimExpired(ctx context.Context, live Session) bool {
	now := s.now()
	if !lifetime.Expired(live.Window, now) {
		return false
	}
	cur, _, err := End(ctx, s.Store, s.Cluster, live.ID, Ending{
		Reason: EndReason{Kind: EndExpired, Actor: ActorOpen, Detail: "reclaimed when the student opened a new lab"},
		Due:    func(cur Session) bool { return lifetime.Expired(cur.Window, now) },
	}, now)
	if err != nil {
		s.Log.Warn("cannot reclaim expired session", "session", live.ID, "err", err)
		return false
	}
	if cur.Status.Live() {
		return false
	}
	s.Log.Info("expired session reclaimed on open", "session", live.ID, "status", cur.Status)
	s.Seating.Freed(ctx)
	return true
}

// Get returns where the student stands (Standing.Session): the session
// with id if id is non-empty, else their live one or, failing that, their
// most recent. A student in the line (whose entry has id, if id is
// non-empty) gets their current place instead (Standing.Waiting), and the
// poll keeps the place (entries nobody polls are dropped, see
// Limits.QueueIdle). A provisioning session is checked against the
// cluster first and becomes running once every node is ready. Returns
// ErrNoSession if there is neither, or if id belongs to another student
// or to a warm-pool instance no student holds (indistinguishable on
// purpose).
func (s *Service) Get(ctx context.Context, student, id string) (Standing, error) {
	if w, err := s.Seating.Queued(ctx, student); err == nil && (id == "" || id == w.ID) {
		return Standing{Waiting: &w}, nil
	} else if err != nil && !errors.Is(err, ErrNoSession) {
		return Standing{}, err
	}
	var sess Session
	var err error
	if id != "" {
		sess, err = s.Store.Get(ctx, id)
		if err == nil && (sess.Student != student || sess.Pool.Unclaimed()) {
			err = fmt.Errorf("%w: no session %s for this student", ErrNoSession, id)
		}
	} else {
		sess, err = s.Store.Latest(ctx, student)
	}
	if err != nil {
		return Standing{}, err
	}
	sess = s.Refresh(ctx, sess)
	return Standing{Session: &sess}, nil
}

// Extend pushes the student's running session's expiry to
// min(now + lifetime, maxExpiresAt). id, if non-empty, must name that
// session. Returns ErrNoSession if the student has no live session (or id
// is not it), ErrNotRunning if it is still provisioning or already expired,
// and ErrExtensionCap if it already runs until its maximum lifetime.
func (s *Service) Extend(ctx context.Context, student, id string) (_ Session, err error) {
	defer func() { s.extended(err) }()
	for attempt := 0; ; attempt++ {
		sess, err := s.liveOwned(ctx, student, id)
		if err != nil {
			return Session{}, err
		}
		sess = s.Refresh(ctx, sess)
		if sess.Status != StatusRunning {
			return sess, fmt.Errorf("%w: session is %s", ErrNotRunning, sess.Status)
		}
		w, err := s.Policy.Extend(sess.Window, s.now())
		switch {
		case errors.Is(err, lifetime.ErrExpired):
			return sess, fmt.Errorf("%w: session expired at %s", ErrNotRunning, sess.ExpiresAt.Format(time.RFC3339))
		case errors.Is(err, lifetime.ErrAtCap):
			return sess, fmt.Errorf("%w: session already runs until its maximum lifetime %s", ErrExtensionCap, sess.MaxExpiresAt.Format(time.RFC3339))
		case err != nil:
			return sess, err
		}
		updated, err := s.Store.Extend(ctx, sess.ID, sess.ExpiresAt, w.ExpiresAt)
		if errors.Is(err, ErrConflict) && attempt < 5 {
			continue
		}
		if errors.Is(err, ErrNotLive) {
			return updated, fmt.Errorf("%w: session is %s", ErrNotRunning, updated.Status)
		}
		return updated, err
	}
}

// Close ends the student's live session (End: its resources are deleted,
// then the row is marked), recording by whom: the student or an admin
// (by names them in the log and the admin-only detail). id, if non-empty,
// must name that session. Returns ErrNoSession if there is no live session.
// If a delete fails the row stays live (so the reaper retries) and the
// error is returned.
//
// A session whose time is already up (lifetime.Expired, the reaper's rule)
// is torn down the same way but recorded expired, not closed: the student
// did not end it early, time did — which is what getSession already showed
// them and what the reaper would have recorded moments later, so the
// history an SRE reads does not depend on who got there first.
//
// Because End holds the row lock, an Open still creating objects for this
// row sees the row finished when it re-checks and deletes what it created
// after these deletes.
func (s *Service) Close(ctx context.Context, student, id string, actor Actor, by string) (Session, error) {
	sess, err := s.liveOwned(ctx, student, id)
	if errors.Is(err, ErrNoSession) {
		// A student in the line leaves it.
		if left, lerr := s.Seating.Leave(ctx, student, id, actor, by); lerr == nil {
			return left, nil
		} else if !errors.Is(lerr, ErrNoSession) {
			return Session{}, lerr
		}
	}
	if err != nil {
		return Session{}, err
	}
	now := s.now()
	reason := EndReason{Kind: EndClosed, Actor: actor, Detail: "closed by " + string(actor) + " " + by}
	if lifetime.Expired(sess.Window, now) {
		reason.Kind = EndExpired
		reason.Detail = fmt.Sprintf("expired at %s; %s after its expiry", sess.ExpiresAt.UTC().Format(time.RFC3339), reason.Detail)
	}
	closed, ended, err := End(ctx, s.Store, s.Cluster, sess.ID, Ending{Reason: reason}, now)
	switch {
	case errors.Is(err, ErrTeardown):
		return sess, err
	case err != nil:
		return closed, err
	case !ended:
		// The reaper (or another close) finished it between our read and
		// the row lock; it deleted the resources before marking.
		return closed, nil
	}
	s.Log.Info("session closed", "session", sess.ID, "status", closed.Status, "reason", closed.End.String())
	s.ended(closed.End)
	s.Seating.Freed(ctx)
	return closed, nil
}

func (s *Service) liveOwned(ctx context.Context, student, id string) (Session, error) {
	sess, err := s.Store.LiveFor(ctx, student)
	if err != nil {
		return Session{}, err
	}
	if id != "" && id != sess.ID && id != sess.ClaimedFor {
		return Session{}, fmt.Errorf("%w: no live session %s for this student", ErrNoSession, id)
	}
	return sess, nil
}
