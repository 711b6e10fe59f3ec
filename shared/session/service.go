package session

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"

	"labkeep/shared/labs"
	"labkeep/shared/lifetime"
	"labkeep/shared/setting"
)

// Service implements openSession, extendSession, getSession and
// closeSession. It holds no state between calls, so any number of
// instances (Knative pods, Lambda invocations) can serve at once.
type Service struct {
	Store   Store
	Cluster Cluster
	Labs    Catalog
	Policy  lifetime.Policy
	Limits  Limits
	// Waitlist is the line of students waiting for capacity (see
	// OpenWaiting); nil: nobody can wait, a full open is refused.
	Waitlist Waitlist
	// Now is the clock; time.Now in production.
	Now func() time.Time
	Log *slog.Logger
	// Metrics, if set, counts opens, extensions, endings and time to ready.
	Metrics *Metrics
	// Pool, if set, is the warm pool an open claims from before it
	// provisions cold (see WarmPool).
	Pool *WarmPool
}

// Catalog is where Open looks labs up: a *labs.Live re-read while the
// functions run, or a fixed *labs.Catalog. Only Open reads it: a session
// stores its kind and nodes, so extend, close and teardown never depend on
// the catalog in force.
type Catalog interface {
	Get(name string) (labs.Lab, bool)
	Names() []string
}

// Limits bound what the Service does.
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

// DefaultLimits are the Service's limits unless told otherwise: the
// capacity wait is half the reaper's default 2-minute provisioning grace.
func DefaultLimits() Limits {
	return Limits{MaxVMs: 8, MaxPods: 20, CapacityWait: 60 * time.Second, CleanupTimeout: 30 * time.Second, QueueIdle: DefaultQueueIdle}
}

// Validate reports limits the Service cannot work with.
func (l Limits) Validate() error {
	return errors.Join(
		setting.AtLeast("MaxVMs", l.MaxVMs, 1),
		setting.AtLeast("MaxPods", l.MaxPods, 1),
		setting.Positive("CapacityWait", l.CapacityWait),
		setting.Positive("CleanupTimeout", l.CleanupTimeout),
		setting.Positive("QueueIdle", l.QueueIdle))
}

// ErrEndedWhileProvisioning is returned by Open when the session's row was
// finished by someone else (the student's close, an admin, the reaper)
// while Open was still queued or creating objects. Whatever Open created
// has been deleted; the row keeps the status the other party gave it.
var ErrEndedWhileProvisioning = fmt.Errorf("%w: session was ended while it was being provisioned", ErrProvisioning)

func (s *Service) now() time.Time { return s.Now().UTC().Truncate(time.Microsecond) }

// Open starts a session of lab for student and returns it (provisioning;
// poll Get until running). The session gets its own SSH host key, and the
// student logs in with publicKey (one authorized_keys line) or, if it is
// empty, with a key pair generated here: its private half is in the
// returned session's Issued, the only time anyone sees it. Returns:
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
func (s *Service) Open(ctx context.Context, student, labName, publicKey string) (_ Session, err error) {
	defer func() { s.Metrics.opened(labName, err) }()
	return s.open(ctx, student, labName, publicKey, false)
}

func (s *Service) open(ctx context.Context, student, labName, publicKey string, wait bool) (Session, error) {
	lab, ok := s.Labs.Get(labName)
	if !ok {
		return Session{}, fmt.Errorf("%w %q; valid labs: %s", ErrUnknownLab, labName, strings.Join(s.Labs.Names(), ", "))
	}
	var studentKey string
	if publicKey != "" {
		var err error
		if studentKey, err = NormalizeStudentKey(publicKey); err != nil {
			return Session{}, err
		}
	}
	if live, err := s.Store.LiveFor(ctx, student); err == nil {
		if !s.reclaimExpired(ctx, live) {
			return live, fmt.Errorf("%w: student already has session %s (%s)", ErrSessionExists, live.ID, live.Status)
		}
	} else if !errors.Is(err, ErrNoSession) {
		return Session{}, err
	}
	// A student already in the line keeps their place: a repeated open
	// is a poll, never a second entry.
	if q, err := s.queued(ctx, student); err == nil {
		return q, nil
	} else if !errors.Is(err, ErrNoSession) {
		return Session{}, err
	}
	sess, err := s.newSession(uuid.NewString(), student, lab, studentKey)
	if err != nil {
		return Session{}, err
	}
	if err := s.Store.Create(ctx, sess); err != nil {
		if errors.Is(err, ErrSessionExists) {
			live, gerr := s.Store.LiveFor(ctx, student)
			if gerr != nil {
				return Session{}, err
			}
			return live, fmt.Errorf("%w: student already has session %s (%s)", ErrSessionExists, live.ID, live.Status)
		}
		return Session{}, err
	}
	log := s.Log.With("session", sess.ID, "lab", lab.Name)
	started, queued, err := s.provision(ctx, sess, lab, wait)
	if err == nil && queued.Pool == PoolClaimed {
		queued.Issued = Issued{StudentPrivateKey: sess.Issued.StudentPrivateKey}
		return queued, nil
	}
	if err == nil && !started {
		// The line may have room nobody has handed on yet (an idle head
		// was dropped just now): serve it, then answer with where the
		// student stands — still queued, or served already.
		s.serveDetached(ctx)
		if cur, err := s.Get(ctx, student, queued.ID); err == nil {
			queued = cur
		}
		if queued.ID == sess.ID { // not a place the student already had
			queued.Issued = Issued{StudentPrivateKey: sess.Issued.StudentPrivateKey}
		}
		return queued, nil
	}
	if errors.Is(err, ErrEndedWhileProvisioning) {
		defer s.serveDetached(ctx)
		return s.abandon(ctx, log, sess, err, started)
	}
	if err != nil {
		if started {
			defer s.serveDetached(ctx)
		}
		return s.rollback(ctx, log, sess, err, started)
	}
	// Someone may have finished the row while the objects were being
	// created (the reaper's ghost rule, a close). Checked under the row
	// lock, so a finisher in flight is waited for; after this point a
	// finisher's Teardown runs after every create and catches everything.
	cur, err := s.confirmLive(ctx, sess.ID)
	if err != nil {
		return s.abandon(ctx, log, sess, err, true)
	}
	log.Info("session provisioned", "nodes", len(sess.Nodes))
	// The host private key stays in the cluster's Secret; only the
	// student's generated key is handed back, this once.
	cur.Issued = Issued{StudentPrivateKey: sess.Issued.StudentPrivateKey}
	return cur, nil
}

// issueKeys gives a new session its own SSH host key and, when the student
// brought no public key (studentKey empty), a key pair of its own whose
// private half only the Open's caller ever sees.
func issueKeys(sess *Session, studentKey string) error {
	hostPub, hostPriv, err := newKeyPair("labkeep session " + sess.ID + " host key")
	if err != nil {
		return err
	}
	sess.HostKey, sess.Issued.HostPrivateKey = hostPub, hostPriv
	if studentKey == "" {
		pub, priv, err := newKeyPair("labkeep session " + sess.ID)
		if err != nil {
			return err
		}
		studentKey, sess.Issued.StudentPrivateKey = pub, priv
	}
	sess.StudentKey = studentKey
	return nil
}

// confirmLive re-reads the row once any Close or reaper holding its row
// lock has committed. Returns the live row, or ErrEndedWhileProvisioning with
// the row's final status if it was finished meanwhile.
func (s *Service) confirmLive(ctx context.Context, id string) (Session, error) {
	cur, err := s.Store.GetSettled(ctx, id)
	if err != nil {
		return cur, fmt.Errorf("re-reading session %s: %w", id, err)
	}
	if !cur.Status.Live() {
		return cur, fmt.Errorf("%w (it is now %s)", ErrEndedWhileProvisioning, cur.Status)
	}
	return cur, nil
}

// abandon deletes what an open created for a row that someone else has
// finished (or that could not be re-read) and returns the row as it now
// is, with cause. The row is not written: its status and reason are the
// finisher's. If the row could not be re-read it is marked failed, like
// any failed open, so the student is not locked out.
func (s *Service) abandon(ctx context.Context, log *slog.Logger, sess Session, cause error, teardown bool) (Session, error) {
	if !errors.Is(cause, ErrEndedWhileProvisioning) {
		return s.rollback(ctx, log, sess, fmt.Errorf("%w: %w", ErrProvisioning, cause), teardown)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.Limits.CleanupTimeout)
	defer cancel()
	if teardown {
		if err := s.Cluster.Teardown(cctx, sess); err != nil {
			log.Error("session ended during provisioning; its objects are left for the reaper", "err", err)
		}
	}
	cur, err := s.Store.Get(cctx, sess.ID)
	if err != nil {
		log.Error("cannot re-read session ended during provisioning", "err", err)
		cur = sess
	}
	log.Warn("session ended while it was being provisioned; open abandoned", "status", cur.Status, "reason", cur.End.String())
	return cur, cause
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
	s.serveDetached(ctx)
	return true
}

// provision checks capacity and creates the objects under the capacity
// lock, so concurrent opens cannot all see room for one more VM. started
// reports whether any object may have been created (false when refused
// before the first create, so there is nothing to roll back). While
// anyone waits in the line there is no room for an open (it would jump
// the line); with wait, an open that finds no room joins the line under
// the same lock and comes back as queued (started false, err nil).
func (s *Service) provision(ctx context.Context, sess Session, lab labs.Lab, wait bool) (started bool, queued Session, err error) {
	if c := s.capacityFor(lab); c.need > 0 {
		lockWait := s.Limits.CapacityWait
		lctx, cancel := context.WithTimeout(ctx, lockWait)
		unlock, err := s.Store.LockCapacity(lctx)
		timedOut := lctx.Err() != nil && ctx.Err() == nil
		cancel()
		switch {
		case err != nil && timedOut:
			return false, queued, fmt.Errorf("%w: waited %s for the capacity lock (other opens are queued)", ErrNoCapacity, lockWait)
		case err != nil:
			return false, queued, fmt.Errorf("capacity lock: %w", err)
		}
		defer unlock()
		// The open may have queued long enough for its row to be finished
		// (a close, or the reaper's ghost rule): create nothing then.
		if _, err := s.confirmLive(ctx, sess.ID); err != nil {
			return false, queued, err
		}
		waiting, err := s.waiting(ctx, c.what)
		if err != nil {
			return false, queued, err
		}
		// A ready pool instance already holds its capacity; nobody
		// waiting means nobody is passed over.
		if waiting == 0 {
			if claimed, ok := s.claimPooled(ctx, sess, lab); ok {
				return false, claimed, nil
			}
		}
		used, err := c.count(ctx)
		var full error
		switch {
		case err != nil:
			// Don't lock every student out because a list failed: the
			// namespace's ResourceQuota still refuses VMs beyond the limit.
			s.Log.Warn("cannot count capacity in use; relying on the ResourceQuota", "counting", c.what, "session", sess.ID, "err", err)
		case used+c.need > c.limit:
			full = fmt.Errorf("%w: %d of %d %s in use, lab %s needs %d", ErrNoCapacity, used, c.limit, c.what, lab.Name, c.need)
		}
		if full == nil && waiting > 0 {
			full = fmt.Errorf("%w: %d students wait for capacity", ErrNoCapacity, waiting)
		}
		if full != nil && wait && s.Waitlist != nil {
			queued, err := s.enqueue(ctx, sess)
			return false, queued, err
		}
		if full != nil {
			return false, queued, full
		}
	}
	if err := s.Cluster.Provision(ctx, sess, lab); err != nil {
		if errors.Is(err, ErrNoCapacity) {
			return true, queued, err
		}
		return true, queued, fmt.Errorf("%w: %w", ErrProvisioning, err)
	}
	return true, queued, nil
}

// rollback ends the failed open's row (End: deletes first, then the mark,
// failed with the kind of failure) on a context detached from the request's
// cancellation. If the deletes fail, the row is still marked failed (so the
// student is not locked out); the leftovers are orphans for the reaper. If
// someone else finished the row meanwhile, what the open created is still
// deleted.
func (s *Service) rollback(ctx context.Context, log *slog.Logger, sess Session, cause error, teardown bool) (Session, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.Limits.CleanupTimeout)
	defer cancel()
	kind, ok := ErrorKind(cause)
	if !ok {
		kind = EndProvisioningFailed
	}
	reason := EndReason{Kind: kind, Actor: ActorOpen, Detail: cause.Error()}
	failed, ended, err := End(cctx, s.Store, s.clusterFor(teardown), sess.ID, Ending{Reason: reason, EvenIfTeardownFails: true}, s.now())
	if ended {
		s.Metrics.ended(failed.End)
	}
	if err != nil {
		log.Error("rollback left objects for the reaper", "err", err)
	}
	if !ended && teardown {
		if err := s.Cluster.Teardown(cctx, sess); err != nil {
			log.Error("rollback left objects for the reaper", "err", err)
		}
	}
	level := slog.LevelWarn
	if errors.Is(cause, ErrNoCapacity) {
		level = slog.LevelInfo // expected under load, not a fault
	}
	log.Log(cctx, level, "open failed, rolled back", "reason", failed.End.String())
	return failed, cause
}

// clusterFor is the Cluster an ending deletes through: the real one, or,
// for an open refused before its first create, one with nothing to delete,
// so a refusal under load costs no API calls.
func (s *Service) clusterFor(created bool) Cluster {
	if created {
		return s.Cluster
	}
	return nothingCreated{s.Cluster}
}

// nothingCreated is a Cluster whose session has no objects yet.
type nothingCreated struct{ Cluster }

func (nothingCreated) Teardown(context.Context, Session) error { return nil }

// Get returns the student's session: the one with id if id is non-empty,
// else their live one or, failing that, their most recent. A student in
// the line gets their queued session with its current place, and the poll
// keeps the place (entries nobody polls are dropped, see
// Limits.QueueIdle). A provisioning
// session is checked against the cluster first and becomes running once
// every node is ready. Returns ErrNoSession if there is none, or if id
// belongs to another student (indistinguishable on purpose).
func (s *Service) Get(ctx context.Context, student, id string) (Session, error) {
	if q, err := s.queued(ctx, student); err == nil && (id == "" || id == q.ID) {
		return q, nil
	} else if err != nil && !errors.Is(err, ErrNoSession) {
		return Session{}, err
	}
	var sess Session
	var err error
	if id != "" {
		sess, err = s.Store.Get(ctx, id)
		if err == nil && sess.Student != student {
			err = fmt.Errorf("%w: no session %s for this student", ErrNoSession, id)
		}
	} else {
		sess, err = s.Store.Latest(ctx, student)
	}
	if err != nil {
		return Session{}, err
	}
	return s.refresh(ctx, sess), nil
}

// refresh moves a provisioning session to running when the cluster says
// every node is ready; the ready time comes from the cluster's condition
// timestamps (see recordedReadyAt), so time-to-ready does not depend on how
// often anyone polls.
// Cluster errors are logged and the stored state returned.
func (s *Service) refresh(ctx context.Context, sess Session) Session {
	if sess.Status != StatusProvisioning {
		return sess
	}
	states, err := s.Cluster.Observe(ctx, sess)
	if err != nil {
		s.Log.Warn("cannot observe session", "session", sess.ID, "err", err)
		return sess
	}
	ready := len(states) == len(sess.Nodes)
	var readyAt time.Time
	for i := range sess.Nodes {
		if i >= len(states) {
			break
		}
		st := states[i]
		sess.Nodes[i].Ready = st.Ready
		if st.Host != "" {
			sess.Nodes[i].SSHHost = st.Host
		}
		ready = ready && st.Ready
		if st.ReadyAt.After(readyAt) {
			readyAt = st.ReadyAt
		}
	}
	if !ready {
		return sess
	}
	readyAt = recordedReadyAt(readyAt, sess.StartedAt, s.now())
	updated, err := s.Store.MarkRunning(ctx, sess.ID, readyAt.UTC().Truncate(time.Microsecond), sess.Nodes)
	if err != nil && !errors.Is(err, ErrNotLive) {
		s.Log.Warn("cannot mark session running", "session", sess.ID, "err", err)
		return sess
	}
	if err == nil {
		s.Log.Info("session ready", "session", sess.ID, "timeToReady", updated.TimeToReady())
		s.Metrics.ready(updated)
	}
	return updated
}

// conditionResolution is the precision of Kubernetes condition times,
// which are serialised in whole seconds (truncated).
const conditionResolution = time.Second

// recordedReadyAt turns the latest Ready condition time of a session's
// nodes into the time recorded as ready: the condition time is truncated to
// the second, so the node became ready within [cond, cond+1s); the recorded
// value is the tightest bound that is never early — cond+1s, or the moment
// readiness was observed if that is sooner — and never before the session
// started. Without a condition time, the observation time is used.
func recordedReadyAt(cond, startedAt, observedAt time.Time) time.Time {
	at := observedAt
	if !cond.IsZero() {
		if upper := cond.Add(conditionResolution); upper.Before(at) {
			at = upper
		}
	}
	if at.Before(startedAt) {
		at = startedAt
	}
	return at.UTC().Truncate(time.Microsecond)
}

// Extend pushes the student's running session's expiry to
// min(now + lifetime, maxExpiresAt). id, if non-empty, must name that
// session. Returns ErrNoSession if the student has no live session (or id
// is not it), ErrNotRunning if it is still provisioning or already expired,
// and ErrExtensionCap if it already runs until its maximum lifetime.
func (s *Service) Extend(ctx context.Context, student, id string) (_ Session, err error) {
	defer func() { s.Metrics.extended(err) }()
	for attempt := 0; ; attempt++ {
		sess, err := s.liveOwned(ctx, student, id)
		if err != nil {
			return Session{}, err
		}
		sess = s.refresh(ctx, sess)
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
		if left, lerr := s.leave(ctx, student, id, actor, by); lerr == nil {
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
	s.Metrics.ended(closed.End)
	s.serveDetached(ctx)
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

// newToken returns 256 random bits, hex encoded.
func newToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}
