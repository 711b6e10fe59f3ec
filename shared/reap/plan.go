// Package reap reclaims what lab sessions used: one function, Reaper.RunOnce,
// serves both the one-minute schedule (reapTick) and the admin button
// (adminReapNow). Each run looks three ways — expired sessions, orphaned
// objects, ghost sessions — and gives every row and every orphan its own
// failure scope, so one item that fails on every run never stalls the rest
// (the incident behind this design).
//
// Plan is the pure decision (no I/O, clock passed in); Reaper executes a
// plan against the Store and Cluster ports.
package reap

import (
	"fmt"
	"sort"
	"time"

	"labkeep/shared/labs"
	"labkeep/shared/lifetime"
	"labkeep/shared/session"
)

// ItemKind is why something is reaped.
type ItemKind string

// The three ways a run looks.
const (
	// Expired: a live session whose expiry has passed.
	Expired ItemKind = "expired"
	// Orphan: objects of this environment whose session has no live row.
	Orphan ItemKind = "orphan"
	// Ghost: a live session whose VM, VMI or Pod is gone, or that never
	// became ready within the provisioning timeout.
	Ghost ItemKind = "ghost"
)

// Item is one unit of work with its own failure scope: a session (expired
// or ghost) or the objects of one orphaned session id.
type Item struct {
	Kind ItemKind
	// SessionID is the session row (expired, ghost) or the
	// labkeep.io/session label of the orphaned objects.
	SessionID string
	// Session is the live row, for expired and ghost items.
	Session session.Session
	// Objects are the orphaned objects, in the delete order (anchor last),
	// for orphan items.
	Objects []session.ObjectRef
	// Reason says why, in words for the run report and the row.
	Reason string
	// End is how an expired or ghost session's row ends.
	End session.EndReason
}

// Rules are the thresholds of a plan.
type Rules struct {
	// Env is this reaper's labkeep.io/env. The inventory already holds only
	// this environment's objects; Plan checks again, so a mistake there can
	// never make one environment reap another's objects.
	Env string
	// ProvisionTimeout: a session still provisioning this long after it
	// started is a ghost.
	ProvisionTimeout time.Duration
	// ProvisionGrace: a provisioning session whose VM is missing is given
	// this long (the row is written before the objects) before it counts
	// as a ghost.
	ProvisionGrace time.Duration
}

// Plan decides what a run reaps, given the live rows and a snapshot of the
// namespace (inv may be nil if it could not be listed: then only expiry is
// decided, which needs no snapshot).
//
//   - A live session past its expiry (lifetime.Expired, the same rule as
//     the countdown) is Expired — even if it is also a ghost.
//   - A running session one of whose VMs (any VM of that name, labelled or
//     not) or VMIs is missing, or whose workspace Pod is missing, is a
//     Ghost; so is a provisioning session older than ProvisionTimeout with
//     a node not ready (all ready: it only waits for a getSession to mark
//     it running), or older than ProvisionGrace with a VM or Pod missing.
//   - Objects labelled with this environment and a session id that has no
//     live row are an Orphan, one item per session id; objects already
//     being deleted are left to finish. Objects without a session label are
//     never touched: nothing is guessed.
//
// Items come out in a stable order: expired, ghosts, orphans, each by
// session id.
func Plan(now time.Time, live []session.Session, inv *Inventory, r Rules) []Item {
	var expired, ghosts, orphans []Item
	liveIDs := make(map[string]bool, len(live))
	for _, s := range live {
		liveIDs[s.ID] = true
		if lifetime.Expired(s.Window, now) {
			reason := fmt.Sprintf("expired at %s", s.ExpiresAt.UTC().Format(time.RFC3339))
			expired = append(expired, Item{Kind: Expired, SessionID: s.ID, Session: s, Reason: reason,
				End: session.EndReason{Kind: session.EndExpired, Actor: session.ActorReaper, Detail: reason}})
			continue
		}
		if inv == nil {
			continue
		}
		if reason := ghostReason(now, s, inv, r); reason != "" {
			ghosts = append(ghosts, Item{Kind: Ghost, SessionID: s.ID, Session: s, Reason: reason,
				End: session.EndReason{Kind: session.EndGhost, Actor: session.ActorReaper, Detail: reason}})
		}
	}
	if inv != nil {
		bySession := map[string][]session.ObjectRef{}
		for _, o := range inv.Objects {
			if o.Env != r.Env || o.Session == "" || liveIDs[o.Session] || o.Deleting {
				continue
			}
			bySession[o.Session] = append(bySession[o.Session], o.ObjectRef)
		}
		for id, refs := range bySession {
			session.SortForDelete(refs)
			orphans = append(orphans, Item{Kind: Orphan, SessionID: id, Objects: refs,
				Reason: fmt.Sprintf("%d object(s) of session %s, which has no live row", len(refs), id)})
		}
	}
	for _, list := range [][]Item{expired, ghosts, orphans} {
		sort.Slice(list, func(i, j int) bool { return list[i].SessionID < list[j].SessionID })
	}
	return append(append(expired, ghosts...), orphans...)
}

func ghostReason(now time.Time, s session.Session, inv *Inventory, r Rules) string {
	age := now.Sub(s.StartedAt)
	running := s.Status == session.StatusRunning
	timedOut := s.Status == session.StatusProvisioning && r.ProvisionTimeout > 0 && age > r.ProvisionTimeout
	pastGrace := running || age > r.ProvisionGrace
	allReady := true
	if s.Kind == labs.KindPod {
		pods := map[string]Object{}
		for _, o := range inv.Objects {
			if o.Kind == session.KindPod && !o.Deleting {
				pods[o.Name] = o
			}
		}
		for _, n := range s.Nodes {
			name := session.NodeName(s.ID, n.Name)
			pod, ok := pods[name]
			if !ok && pastGrace {
				return fmt.Sprintf("workspace Pod %s no longer exists", name)
			}
			allReady = allReady && ok && pod.Ready
		}
	} else {
		for _, n := range s.Nodes {
			name := session.NodeName(s.ID, n.Name)
			if !inv.VMNames[name] {
				if pastGrace {
					return fmt.Sprintf("VirtualMachine %s no longer exists", name)
				}
				allReady = false
				continue
			}
			vmi, ok := inv.VMIs[name]
			if !ok && running {
				return fmt.Sprintf("VirtualMachineInstance %s no longer exists", name)
			}
			allReady = allReady && ok && vmi.Ready
		}
	}
	// A provisioning row whose nodes are all ready only waits for someone
	// to read it (getSession marks it running): never a ghost.
	if timedOut && !allReady {
		return fmt.Sprintf("did not become ready within %s", r.ProvisionTimeout)
	}
	return ""
}
