// Package session keeps the life of one lab session: what a session is,
// the rules for opening, extending, reading, closing and ending one (End is
// the one way a session ends, whoever ends it), and the ports it needs — a
// Store (the database, the source of truth for who has which session), a
// Cluster (where the session's VMs or Pod run) and Seating (whether an open
// may take shared capacity now, wait in line or take a warm instance:
// package seating implements it, so capacity rules live in one place).
// Starter builds, starts and unwinds rows, including the rollback that
// guarantees a failed open leaves nothing behind; Service answers the
// student's calls. Adapters live in pgstore and kube; the HTTP layer in
// httpapi. The reaper (package reap) reuses Store, Cluster, End and the
// lifetime package so both halves agree on every rule.
//
// What the Starter and the Service do is counted through Metrics, an
// interface the entry points implement (functions/app with Prometheus),
// so the package depends on no metrics library.
package session

import (
	"errors"
	"strings"
	"time"

	"labkeep/shared/labs"
	"labkeep/shared/lifetime"
)

// Status is where a session is in its life. Provisioning and running are
// live: a student has at most one live session (enforced by the database).
// The others are final.
type Status string

// The statuses a session row can have.
const (
	StatusProvisioning Status = "provisioning"
	StatusRunning      Status = "running"
	StatusExpired      Status = "expired"
	StatusFailed       Status = "failed"
	StatusClosed       Status = "closed"
)

// Live reports whether the status holds cluster resources and counts for
// the one-session-per-student rule.
func (s Status) Live() bool { return s == StatusProvisioning || s == StatusRunning }

// Session is one student's lab session as stored.
type Session struct {
	// ID is a random UUID; it is part of every object name, so a new session
	// can never pick up an old session's objects.
	ID      string
	Student string
	Lab     string
	Kind    labs.Kind
	Status  Status
	lifetime.Window
	// ReadyAt is when the last node became ready; zero until running.
	// ReadyAt - StartedAt is the recorded time-to-ready.
	ReadyAt time.Time
	// FinishedAt is when the session reached a final status; zero while live.
	FinishedAt time.Time
	Nodes      []Node
	// End says why and by whom the session ended; zero while live.
	End EndReason
	// StudentKey is the public key (one authorized_keys line) that logs the
	// student in as root on every node: the one they sent with the open, or
	// one labkeep generated (its private half went to them once, in
	// Issued).
	StudentKey string
	// HostKey is the session's own SSH host public key: every node of the
	// session presents it, so a student verifies their first connection
	// (KnownHostsLine) instead of trusting it.
	HostKey string
	// Issued are the secrets the Open that created this session holds;
	// never stored, empty on every session read back.
	Issued Issued
	// GradingToken is 256 random bits (hex) handed to every node through
	// cloud-init, so a grader can tell this session's submissions apart. It
	// is never shown in API responses.
	GradingToken string
	// Pool marks warm-pool rows: PoolIdle for an unclaimed instance,
	// PoolSpent for one a claim has started on, PoolClaimed for a session
	// that came from the pool; empty otherwise.
	Pool PoolState
	// ClaimedFor is, for a session claimed from the pool, the id the
	// student knew before the claim (their open's row or waitlist entry);
	// that id names this session too.
	ClaimedFor string
	// Home is the name of the student's home the session holds (Homes),
	// empty for a lab that keeps none: while the session is live its home
	// is in use, and the last such session's end is the home's last use.
	Home string
	// Reservation is the reservation whose seat the session holds (0:
	// it came through the general line): an unclaimed warm-pool row holds
	// it for a member of the class to claim, any other live row took it.
	Reservation int64
	// Courses are the courses the student who opened it is a member of
	// (their token's), which admission reads for a reserved seat. They
	// are not stored.
	Courses []string
}

// PoolState marks the rows of warm-pool instances (kept by the seating
// package): an instance is stored as a session row so that it counts
// against the same capacity and the reaper sees its objects as a live
// session's, never as orphans.
type PoolState string

// The pool states of a session row.
const (
	// PoolIdle: an unclaimed warm-pool instance (its student is the
	// seating package's sentinel, seating.PoolStudent). Student reads
	// (Store.LiveFor, Store.Latest) never return an idle row, whoever
	// asks.
	PoolIdle PoolState = "idle"
	// PoolSpent: an instance a claim has started on, marked (and
	// committed) before any key is written to it, so it may hold a
	// student's key: it is never claimed again and, unless that claim
	// completes (PoolClaimed), it is ended. Like an idle row it belongs to
	// no student, and no student read returns it.
	PoolSpent PoolState = "spent"
	// PoolClaimed: a student's session that came from the warm pool.
	PoolClaimed PoolState = "claimed"
)

// Unclaimed reports whether the row is a warm-pool instance no student
// holds (idle or spent): every student path (getSession, extend, close,
// the terminal) treats it as no session at all.
func (p PoolState) Unclaimed() bool { return p == PoolIdle || p == PoolSpent }

// ReservedPrefix starts the student ids the platform keeps for itself
// (the warm pool's instances are stored under one): a token whose subject
// starts with it is refused at authentication, so no caller acts as one.
const ReservedPrefix = "labkeep:"

// Reserved reports whether id is one of the platform's own student ids.
func Reserved(id string) bool { return strings.HasPrefix(id, ReservedPrefix) }

// Node is one machine of a session.
type Node struct {
	Name  string `json:"name"`
	Role  string `json:"role"`
	Ready bool   `json:"ready"`
	// SSHHost is where a student reaches the node; empty until known.
	SSHHost string `json:"sshHost,omitempty"`
	SSHPort int32  `json:"sshPort"`
	// Unschedulable is NodeState.Unschedulable at the last look: why the
	// cluster cannot place the node (empty once it can, or runs).
	Unschedulable string `json:"unschedulable,omitempty"`
}

// StatusAt is the status a student should see at now: the stored one,
// except that a live session whose time is up (lifetime.Expired, the
// reaper's own rule) reads expired, although its row stays live until the
// reaper (or a close, or the student's next open) has deleted its
// resources — the student cannot use or extend it any more either way.
func (s Session) StatusAt(now time.Time) Status {
	if s.Status.Live() && lifetime.Expired(s.Window, now) {
		return StatusExpired
	}
	return s.Status
}

// TimeToReady is how long the session took from open to every node being
// ready; zero if it never became ready.
func (s Session) TimeToReady() time.Duration {
	if s.ReadyAt.IsZero() {
		return 0
	}
	return s.ReadyAt.Sub(s.StartedAt)
}

// Errors the Service returns; the HTTP layer maps each to one status code.
// They are wrapped with a message saying why, so match them with errors.Is.
var (
	// ErrSessionExists: the student already has a live session.
	ErrSessionExists = errors.New("session_exists")
	// ErrNoCapacity: the concurrent-VM limit (or the cluster quota) is reached.
	ErrNoCapacity = errors.New("no_capacity")
	// ErrExtensionCap: the session already expires at its maximum lifetime.
	ErrExtensionCap = errors.New("extension_cap")
	// ErrNotRunning: the session cannot be extended because it is still
	// provisioning or has expired.
	ErrNotRunning = errors.New("not_running")
	// ErrNoSession: no such session for this student.
	ErrNoSession = errors.New("no_session")
	// ErrHomeQuota: the lab keeps a home (labs.Home) the student does not
	// have yet, and a new one would take their homes past the total a
	// student may keep.
	ErrHomeQuota = errors.New("home_quota")
	// ErrHomeBusy: the student's home for the lab is being deleted (the
	// next open makes a new one), or, for a download, it is being
	// downloaded already or a session still holds it.
	ErrHomeBusy = errors.New("home_busy")
	// ErrUnknownLab: the lab name is not in the catalog.
	ErrUnknownLab = errors.New("unknown_lab")
	// ErrProvisioning: creating the session's resources failed for a reason
	// other than capacity; everything created was deleted and the row is
	// failed, so the student may retry at once.
	ErrProvisioning = errors.New("provisioning_failed")
	// ErrNotLive is returned by Store updates that require a live session
	// when the row has meanwhile reached a final status (e.g. the reaper
	// expired it).
	ErrNotLive = errors.New("session is no longer live")
	// ErrConflict is returned by Store.Extend when the expiry changed since
	// it was read; the caller re-reads and retries.
	ErrConflict = errors.New("session changed concurrently")
)
