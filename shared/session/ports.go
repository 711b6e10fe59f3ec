package session

import (
	"context"
	"labkeep/shared/line"
	"time"

	"labkeep/shared/labs"
)

// Store is the database of sessions. Implementations must enforce at most
// one live session per student atomically (two concurrent Creates for one
// student: exactly one succeeds).
type Store interface {
	// Create inserts s (status provisioning). Returns ErrSessionExists if the
	// student already has a live session.
	Create(ctx context.Context, s Session) error
	// Get returns the session with id, or ErrNoSession.
	Get(ctx context.Context, id string) (Session, error)
	// LiveFor returns the student's live session, or ErrNoSession.
	LiveFor(ctx context.Context, student string) (Session, error)
	// Latest returns the student's live session if there is one, else their
	// most recently started one, or ErrNoSession if they never had one.
	Latest(ctx context.Context, student string) (Session, error)
	// RecentOpens returns the start times of the student's session rows
	// started after since, newest first, at most limit (OpenRate).
	RecentOpens(ctx context.Context, student string, since time.Time, limit int) ([]time.Time, error)
	// ListLive returns every live session (for the reaper), oldest first.
	ListLive(ctx context.Context) ([]Session, error)
	// MarkRunning moves a provisioning session to running with its ready
	// time and node details. Returns ErrNotLive if it is no longer
	// provisioning (someone else moved it on); the current row is returned
	// either way when it exists.
	MarkRunning(ctx context.Context, id string, readyAt time.Time, nodes []Node) (Session, error)
	// SetNodes records what the cluster now says about a running
	// session's nodes (readiness, address): a VM whose guest powered off
	// comes back on a new virt-launcher Pod with a new address. Returns
	// ErrNotLive if the session is no longer running; the current row is
	// returned either way when it exists.
	SetNodes(ctx context.Context, id string, nodes []Node) (Session, error)
	// Extend sets a running session's expiry to to, only if it is still
	// from. Returns ErrConflict if the expiry changed meanwhile, and
	// ErrNotLive if the session is no longer running.
	Extend(ctx context.Context, id string, from, to time.Time) (Session, error)
	RowFinisher
	// GetSettled reads the row after waiting for any FinishIf holding its
	// row lock to commit, so a Close or reaper part-way through is seen
	// finished, never still live. Returns ErrNoSession if there is none.
	GetSettled(ctx context.Context, id string) (Session, error)
}

// RowFinisher is the row lock End ends a session under.
type RowFinisher interface {
	// FinishIf re-reads the row under its row lock (waiting for any other
	// holder) and, if it is still live and due(row), runs act and marks
	// the row final with the reason act returns, only if act returned a nil
	// error; ok reports whether it did. The row as read (or as marked) is
	// returned either way; act's error is returned and leaves the row as it
	// was. Returns ErrNoSession if there is no such row.
	FinishIf(ctx context.Context, id string, due func(Session) bool, act func(Session) (EndReason, error),
		at time.Time) (s Session, ok bool, err error)
}

// Teardowner deletes what a session owns.
type Teardowner interface {
	// Teardown deletes every object s can own (Objects(s)), by name and in
	// the delete order; objects already gone count as deleted. An object
	// not labelled with this environment and s is never deleted: that is an
	// error. It returns nil only when every delete succeeded.
	Teardown(ctx context.Context, s Session) error
}

// NodeState is what the cluster says about one node of a session.
type NodeState struct {
	Name string
	// Exists is false when the node's VM (or Pod) is gone.
	Exists bool
	// Ready is true when the VMI is Running with condition Ready=True (or
	// the Pod is Running and Ready).
	Ready bool
	// ReadyAt is when Ready last became true, per the cluster; zero if
	// unknown.
	ReadyAt time.Time
	// Host is the node's address for SSH, empty until the cluster has one.
	Host string
	// Unschedulable is why the cluster cannot place the node now, in the
	// scheduler's words (for a VM, those KubeVirt copies from its
	// virt-launcher Pod), e.g. "0/1 nodes are available: 1 Insufficient
	// cpu."; empty while nothing says so.
	Unschedulable string
}

// Cluster is where sessions run. Every object it creates carries the
// session's labels and an ownerReference to the session's deadline anchor,
// and is named after the session id, so Teardown can find it by name.
type Cluster interface {
	// Provision creates the session's objects in order: deadline anchor,
	// per-node cloud-init Secrets, the session's NetworkPolicy, VMs (plus a
	// Service for multi-node labs) or the workspace Pod. It stops at the first error,
	// leaving what was created for Teardown. A quota refusal is returned
	// wrapped in ErrNoCapacity.
	Provision(ctx context.Context, s Session, lab labs.Lab) error
	// Observe returns the state of each node of s, in s.Nodes order.
	Observe(ctx context.Context, s Session) ([]NodeState, error)
	Teardowner
}

// Homes keeps students' homes (labs.Home): a volume of the student's own,
// made by the first open of a lab that keeps one and used again by every
// later open of a lab with the same home; no session owns it.
type Homes interface {
	// HomeFor names the student's home for lab ("" when the lab keeps
	// none) when it exists or a new one fits the student's total;
	// otherwise it refuses with ErrHomeQuota, saying by how much. An open
	// asks before it writes its row, so a refused open leaves nothing
	// behind, and the row records the name (Session.Home).
	HomeFor(ctx context.Context, student string, lab labs.Lab) (string, error)
}

// Seating admits opens to the capacity every session shares (package
// seating implements it: the capacity lock, the waitlist, the warm pool).
// Service declares what it needs here, so session never depends on
// seating; the entry points wire the one in.
type Seating interface {
	// Seat admits sess, an open's provisioning row already written, to
	// lab's capacity under the capacity lock, and either creates its
	// objects (started true, placed zero), hands the student a ready
	// warm-pool instance (started false, placed.Session is the claimed
	// session, Pool PoolClaimed), puts the student in the line if wait
	// (started false, placed.Waiting is their place), or refuses with
	// ErrNoCapacity (started false: nothing was created). A row finished
	// meanwhile yields ErrEndedWhileProvisioning before anything is
	// created; a create the cluster refuses yields its error with started
	// true.
	Seat(ctx context.Context, sess Session, lab labs.Lab, wait bool) (started bool, placed Standing, err error)
	// Queued is the student's place in the line, after a sign of life;
	// ErrNoSession if they do not wait.
	Queued(ctx context.Context, student string) (line.Waiting, error)
	// Leave takes the student out of the line (a close while queued); id,
	// if non-empty, must be their entry's. ErrNoSession if they do not
	// wait.
	Leave(ctx context.Context, student, id string, actor Actor, by string) (Session, error)
	// Freed hands capacity a session just gave back to the line, on a
	// context that outlives the caller's request.
	Freed(ctx context.Context)
}
