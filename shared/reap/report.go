package reap

import "time"

// Report is what one run did: the response of reapTick and adminReapNow,
// and the record an SRE reads in adminStatus.
type Report struct {
	// ID is the stored run's id (0 if it could not be stored).
	ID         int64     `json:"id"`
	Trigger    Trigger   `json:"trigger"`
	StartedAt  time.Time `json:"startedAt"`
	FinishedAt time.Time `json:"finishedAt"`
	DryRun     bool      `json:"dryRun"`
	// Counts is items handled per kind, e.g. {"expired": 3, "orphan": 1}.
	Counts map[ItemKind]int `json:"counts"`
	// Failures lists every item the run could not handle, with the reason.
	Failures []Failure `json:"failures"`
	// Items lists every item the run handled, or would have in a dry run.
	Items []Reaped `json:"items"`
	// PrunedRuns is how many records of runs older than the retention this
	// run deleted (in a dry run too: they are the reaper's own records,
	// not a lab's resources).
	PrunedRuns int `json:"prunedRuns"`
	// PrunedRefused is how many session rows of opens refused for lack of
	// capacity, finished longer ago than their retention, this run
	// deleted; always 0 in a dry run, which deletes no student's row.
	PrunedRefused int `json:"prunedRefused"`
}

// Reaped is one item a run handled (or would have, in a dry run).
type Reaped struct {
	Kind    ItemKind `json:"kind"`
	Session string   `json:"session"`
	Reason  string   `json:"reason"`
	// Objects are kind/name of an orphan's objects, or a home's claim.
	Objects []string `json:"objects,omitempty"`
}

// Failure is one item (or the inventory) a run failed on.
type Failure struct {
	// Kind is the item's kind, or FailedInventory.
	Kind    ItemKind `json:"kind"`
	Session string   `json:"session,omitempty"`
	Object  string   `json:"object,omitempty"`
	Error   string   `json:"error"`
}

// The Failure kinds that are no item's.
const (
	// FailedInventory: the namespace listing failed (the run then reaps
	// expired sessions only).
	FailedInventory ItemKind = "inventory"
	// FailedRetention: old run records or old refused opens could not be
	// deleted, the error says which (the next run tries again).
	FailedRetention ItemKind = "retention"
	// FailedPool: the warm pool's maintenance failed for some lab (the
	// next run tries again).
	FailedPool ItemKind = "pool"
	// FailedSuspects: the suspects of earlier runs could not be read or
	// this run's stored; no missing VMI or Pod is confirmed until a run
	// can do both.
	FailedSuspects ItemKind = "suspects"
	// FailedHomes: the homes or their use could not be read; no home is
	// deleted this run.
	FailedHomes ItemKind = "homes"
)
