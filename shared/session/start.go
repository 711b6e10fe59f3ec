package session

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"labkeep/shared/labs"
	"labkeep/shared/lifetime"
)

// Starter is the life of one row from its creation to running or its
// rollback: it builds a fresh row, moves a provisioning row to running
// once the cluster says it is ready, and unwinds an open that failed or
// whose row someone else finished. Service and the seating package (which
// starts rows served from the waitlist and warm-pool instances) share one,
// so every row starts and unwinds the same way whoever created it.
type Starter struct {
	Store   Store
	Cluster Cluster
	Policy  lifetime.Policy
	// CleanupTimeout bounds the rollback after a failed open, which runs
	// even if the caller's request was cancelled.
	CleanupTimeout time.Duration
	// Now is the clock; time.Now in production.
	Now func() time.Time
	Log *slog.Logger
	// Metrics counts opens, extensions, endings and time to ready; nil
	// counts nothing.
	Metrics Metrics

	// looked is when follow last looked at each running VM session.
	looked lastLooks
}

// FollowEvery is how often, at most, one process looks at a running VM
// session's nodes in the cluster (follow): a student's page polling
// getSession back to back costs the API server one read per session
// every FollowEvery, not one per poll, and a guest that came back on a
// new address shows it within that (its reboot takes longer).
const FollowEvery = 5 * time.Second

// lastLooks remembers when each session was last looked at.
type lastLooks struct {
	mu     sync.Mutex
	at     map[string]time.Time
	pruned time.Time
}

// due reports whether id was not looked at within FollowEvery before now.
func (l *lastLooks) due(id string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	last, ok := l.at[id]
	return !ok || now.Sub(last) >= FollowEvery || now.Before(last)
}

// looked records that id was looked at now. Entries older than
// FollowEvery are dropped, at most once per FollowEvery, once there are
// many, so ended sessions do not pile up.
func (l *lastLooks) looked(id string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.at == nil {
		l.at = map[string]time.Time{}
	}
	if len(l.at) >= 4096 && now.Sub(l.pruned) >= FollowEvery {
		for k, t := range l.at {
			if now.Sub(t) >= FollowEvery {
				delete(l.at, k)
			}
		}
		l.pruned = now
	}
	l.at[id] = now
}

// Clock is the Starter's now, as rows record it (UTC, microseconds).
func (s *Starter) Clock() time.Time { return s.Now().UTC().Truncate(time.Microsecond) }

func (s *Starter) now() time.Time { return s.Clock() }

// New is a fresh provisioning row for student of lab with id, its own
// host key and grading token, its lifetime starting now; studentKey may
// be empty (a key pair is generated, its private half in Issued).
func (s *Starter) New(id, student string, lab labs.Lab, studentKey string) (Session, error) {
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

// Ready records a student's time to ready (a session claimed from the
// warm pool is ready the moment it is claimed).
func (s *Starter) Ready(sess Session) { s.ready(sess) }

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

// ConfirmLive re-reads the row once any Close or reaper holding its row
// lock has committed. Returns the live row, or ErrEndedWhileProvisioning with
// the row's final status if it was finished meanwhile.
func (s *Starter) ConfirmLive(ctx context.Context, id string) (Session, error) {
	cur, err := s.Store.GetSettled(ctx, id)
	if err != nil {
		return cur, fmt.Errorf("re-reading session %s: %w", id, err)
	}
	if !cur.Status.Live() {
		return cur, fmt.Errorf("%w (it is now %s)", ErrEndedWhileProvisioning, cur.Status)
	}
	return cur, nil
}

// Abandon deletes what an open created for a row that someone else has
// finished (or that could not be re-read) and returns the row as it now
// is, with cause. The row is not written: its status and reason are the
// finisher's. If the row could not be re-read it is marked failed, like
// any failed open, so the student is not locked out.
func (s *Starter) Abandon(ctx context.Context, log *slog.Logger, sess Session, cause error, teardown bool) (Session, error) {
	if !errors.Is(cause, ErrEndedWhileProvisioning) {
		return s.Rollback(ctx, log, sess, fmt.Errorf("%w: %w", ErrProvisioning, cause), teardown)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.CleanupTimeout)
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

// Rollback ends the failed open's row (End: deletes first, then the mark,
// failed with the kind of failure) on a context detached from the request's
// cancellation. If the deletes fail, the row is still marked failed (so the
// student is not locked out); the leftovers are orphans for the reaper. If
// someone else finished the row meanwhile, what the open created is still
// deleted.
func (s *Starter) Rollback(ctx context.Context, log *slog.Logger, sess Session, cause error, teardown bool) (Session, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.CleanupTimeout)
	defer cancel()
	kind, ok := ErrorKind(cause)
	if !ok {
		kind = EndProvisioningFailed
	}
	reason := EndReason{Kind: kind, Actor: ActorOpen, Detail: cause.Error()}
	failed, ended, err := End(cctx, s.Store, s.clusterFor(teardown), sess.ID, Ending{Reason: reason, EvenIfTeardownFails: true}, s.now())
	if ended {
		s.ended(failed.End)
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
func (s *Starter) clusterFor(created bool) Cluster {
	if created {
		return s.Cluster
	}
	return nothingCreated{s.Cluster}
}

// nothingCreated is a Cluster whose session has no objects yet.
type nothingCreated struct{ Cluster }

func (nothingCreated) Teardown(context.Context, Session) error { return nil }

// Refresh moves a provisioning session to running when the cluster says
// every node is ready; the ready time comes from the cluster's condition
// timestamps (see recordedReadyAt), so time-to-ready does not depend on how
// often anyone polls. A running VM session's nodes are looked at again
// (see follow). Cluster errors are logged and the stored state returned.
func (s *Starter) Refresh(ctx context.Context, sess Session) Session {
	switch {
	case sess.Status == StatusRunning && sess.Kind != labs.KindPod:
		return s.follow(ctx, sess)
	case sess.Status != StatusProvisioning:
		return sess
	}
	nodes, ready, cond, ok := s.observe(ctx, sess)
	if !ok {
		return sess
	}
	sess.Nodes = nodes
	if !ready {
		return sess
	}
	readyAt := recordedReadyAt(cond, sess.StartedAt, s.now())
	updated, err := s.Store.MarkRunning(ctx, sess.ID, readyAt.UTC().Truncate(time.Microsecond), sess.Nodes)
	if err != nil && !errors.Is(err, ErrNotLive) {
		s.Log.Warn("cannot mark session running", "session", sess.ID, "err", err)
		return sess
	}
	if err == nil {
		s.Log.Info("session ready", "session", sess.ID, "timeToReady", updated.TimeToReady())
		s.ready(updated)
	}
	return updated
}

// follow keeps a running VM session's nodes true to the cluster: a guest
// powered off from inside comes back (the VM's run strategy) on a new
// virt-launcher Pod with a new address, and reads booting until it is
// ready again. A workspace Pod keeps its address for its life, so Pod
// sessions are not looked at. A session is looked at once per
// FollowEvery (in between, its row is as recorded; a look that could not
// read the cluster does not count); only a change is written.
func (s *Starter) follow(ctx context.Context, sess Session) Session {
	now := s.Now()
	if !s.looked.due(sess.ID, now) {
		return sess
	}
	nodes, _, _, ok := s.observe(ctx, sess)
	if !ok {
		return sess // looked at again at the next poll
	}
	s.looked.looked(sess.ID, now)
	if slices.Equal(nodes, sess.Nodes) {
		return sess
	}
	updated, err := s.Store.SetNodes(ctx, sess.ID, nodes)
	if err != nil {
		if !errors.Is(err, ErrNotLive) {
			s.Log.Warn("cannot record the session's nodes", "session", sess.ID, "err", err)
		}
		return sess
	}
	s.Log.Info("session's nodes changed", "session", sess.ID, "nodes", nodes)
	return updated
}

// observe returns sess's nodes as the cluster shows them now (an address
// once known is kept until the cluster gives another), whether every node
// is ready, and the latest Ready condition time among them (zero if the
// cluster gives none; recordedReadyAt decides what that means). ok is
// false if the cluster could not be read.
func (s *Starter) observe(ctx context.Context, sess Session) (nodes []Node, ready bool, cond time.Time, ok bool) {
	states, err := s.Cluster.Observe(ctx, sess)
	if err != nil {
		s.Log.Warn("cannot observe session", "session", sess.ID, "err", err)
		return nil, false, time.Time{}, false
	}
	nodes = slices.Clone(sess.Nodes)
	ready = len(states) == len(nodes)
	for i := range nodes {
		if i >= len(states) {
			break
		}
		st := states[i]
		nodes[i].Ready = st.Ready
		nodes[i].Unschedulable = st.Unschedulable
		if st.Host != "" {
			nodes[i].SSHHost = st.Host
		}
		ready = ready && st.Ready
		if st.ReadyAt.After(cond) {
			cond = st.ReadyAt
		}
	}
	return nodes, ready, cond, true
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

// newToken returns 256 random bits, hex encoded.
func newToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}
