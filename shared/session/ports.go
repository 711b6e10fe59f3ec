package session

import (
	"context"
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
	// ListLive returns every live session (for the reaper), oldest first.
	ListLive(ctx context.Context) ([]Session, error)
	// MarkRunning moves a provisioning session to running with its ready
	// time and node details. Returns ErrNotLive if it is no longer
	// provisioning (someone else moved it on); the current row is returned
	// either way when it exists.
	MarkRunning(ctx context.Context, id string, readyAt time.Time, nodes []Node) (Session, error)
	// Extend sets a running session's expiry to to, only if it is still
	// from. Returns ErrConflict if the expiry changed meanwhile, and
	// ErrNotLive if the session is no longer running.
	Extend(ctx context.Context, id string, from, to time.Time) (Session, error)
	RowFinisher
	// GetSettled reads the row after waiting for any FinishIf holding its
	// row lock to commit, so a Close or reaper part-way through is seen
	// finished, never still live. Returns ErrNoSession if there is none.
	GetSettled(ctx context.Context, id string) (Session, error)
	// LockCapacity blocks until this caller holds the capacity lock shared
	// by every labkeep instance using the database, so counting VMs and
	// creating new ones is one atomic step. unlock must be called; the lock
	// is also released if the process dies.
	LockCapacity(ctx context.Context) (unlock func(), err error)
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
}

// Cluster is where sessions run. Every object it creates carries the
// session's labels and an ownerReference to the session's deadline anchor,
// and is named after the session id, so Teardown can find it by name.
type Cluster interface {
	// CountVMs counts every VirtualMachine in the namespace — labkeep's or
	// not, any environment — because they all use the same hardware.
	CountVMs(ctx context.Context) (int, error)
	// CountWorkspacePods counts every Pod in the namespace that has a
	// deadline (spec.activeDeadlineSeconds) and has not finished —
	// labkeep's workspace Pods and anyone else's — exactly what the
	// namespace's Terminating-scoped ResourceQuota counts.
	CountWorkspacePods(ctx context.Context) (int, error)
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
