// Package reap reclaims what lab sessions used: one function, Reaper.RunOnce,
// serves both the one-minute schedule (reapTick) and the admin button
// (adminReapNow). Each run looks three ways — expired sessions, orphaned
// objects, ghost sessions — and gives every row and every orphan its own
// failure scope, so one item that fails on every run never stalls the rest
// (the incident behind this design).
//
// Plan is the pure decision (no I/O, clock passed in); Reaper executes a
// plan against the Store and Cluster ports, then hands on to the Backstop
// (seating: the line and the warm pool).
//
// Runs are counted through Metrics, an interface the entry points
// implement (functions/app with Prometheus), so the domain depends on no
// metrics library.
package reap

import (
	"fmt"
	"slices"
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
	// Ghost: a live session whose VM is gone, whose VMI or Pod is missing
	// or down for good (confirmed over looks, see Plan), or that never
	// became ready within the provisioning timeout.
	Ghost ItemKind = "ghost"
)

// Item is one unit of work with its own failure scope: a session (expired
// or ghost), the objects of one orphaned session id, an unused home, or a
// home reader left behind.
type Item struct {
	Kind ItemKind
	// SessionID is the session row (expired, ghost) or the
	// labkeep.io/session label of the orphaned objects.
	SessionID string
	// Session is the live row, for expired and ghost items.
	Session session.Session
	// Objects are the orphaned objects, in the delete order (anchor last),
	// for orphan items; the reader Pod for a HomeReader item.
	Objects []session.ObjectRef
	// Reason says why, in words for the run report and the row.
	Reason string
	// End is how an expired or ghost session's row ends.
	End session.EndReason
	// HomeClaim is the home of a Home item.
	HomeClaim HomeClaim
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
	// AbsentConfirm: a running session's VMI or workspace Pod missing from
	// one look is only a suspicion (KubeVirt recreates the VMI of a VM that
	// should run after a guest poweroff or a drain without live
	// migration); it is a ghost when a later look at least this long after
	// the first still misses it.
	AbsentConfirm time.Duration
	// DownGrace: a running session whose VM KubeVirt reports down (see
	// Inventory.VMDown), or whose workspace Pod has ended, is a ghost once
	// looks have seen it so for this long.
	DownGrace time.Duration
	// HomeRetention: a student's home that no session has held for this
	// long is deleted (PlanHomes); zero keeps homes for ever.
	HomeRetention time.Duration
}

// Trouble is what a look saw wrong with a running session's node.
type Trouble string

// The troubles a look can see.
const (
	// Missing: the node's VMI or workspace Pod is not there.
	Missing Trouble = "missing"
	// Down: the node is there but reported as not running.
	Down Trouble = "down"
)

// Suspect is one trouble of one object of a running session, seen by the
// looks since Since and not (yet) confirmed. Runs hand the suspects on
// through the Store: what one run suspects, a later one confirms or
// clears.
type Suspect struct {
	Session string
	// Object is the object's kind/name, e.g. VirtualMachineInstance/lk-….
	Object  string
	Trouble Trouble
	// Detail is what the cluster reported (for Down), for the reason.
	Detail string
	// Since is the first look that saw this trouble.
	Since time.Time
}

func (s Suspect) key() string { return s.Session + "\x00" + s.Object + "\x00" + string(s.Trouble) }

// Plan decides what a run reaps, given the live rows, a snapshot of the
// namespace (inv may be nil if it could not be listed: then only expiry is
// decided, which needs no snapshot) and the suspects earlier runs handed on
// (prev). It returns the items and the suspects to hand on: every trouble
// this look saw on a running session, with the Since of the earliest look
// that saw it without a break (nil when inv is nil: nothing was looked at).
//
//   - A live session past its expiry (lifetime.Expired, the same rule as
//     the countdown) is Expired — even if it is also a ghost.
//   - A running session one of whose VMs (any VM of that name, labelled or
//     not) is gone is a Ghost at once. One whose VMI or workspace Pod is
//     missing is a Ghost only when an earlier look (a suspect in prev) saw
//     it missing too, at least AbsentConfirm ago; one whose VM is reported
//     down or whose Pod has ended, only once looks have seen it so for
//     DownGrace. A node back between two looks clears its suspect.
//   - A provisioning session older than ProvisionTimeout with a node not
//     ready (all ready: it only waits for a getSession to mark it running)
//     is a Ghost, and so is one older than ProvisionGrace with a VM or Pod
//     missing.
//   - Objects labelled with this environment and a session id that has no
//     live row are an Orphan, one item per session id; objects already
//     being deleted are left to finish. Objects without a session label are
//     never touched: nothing is guessed, but for home readers.
//   - A home reader of this environment that has ended, or was made longer
//     than HomeReaderStart + HomeReaderLifetime ago, is a HomeReader item.
//
// Items come out in a stable order: expired, ghosts, orphans, each by
// session id, then home readers by name.
func Plan(now time.Time, live []session.Session, inv *Inventory, prev []Suspect, r Rules) ([]Item, []Suspect) {
	var expired, ghosts, orphans, readers []Item
	var suspects []Suspect
	seen := make(map[string]Suspect, len(prev))
	for _, s := range prev {
		seen[s.key()] = s
	}
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
		reason, troubles := ghostReason(now, s, inv, seen, r)
		suspects = append(suspects, troubles...)
		if reason != "" {
			ghosts = append(ghosts, Item{Kind: Ghost, SessionID: s.ID, Session: s, Reason: reason,
				End: session.EndReason{Kind: session.EndGhost, Actor: session.ActorReaper, Detail: reason}})
		}
	}
	if inv != nil {
		bySession := map[string][]session.ObjectRef{}
		for _, o := range inv.Objects {
			if o.HomeReader && o.Env == r.Env && o.Session == "" && !o.Deleting {
				if reason := readerReason(now, o); reason != "" {
					readers = append(readers, Item{Kind: HomeReader, Objects: []session.ObjectRef{o.ObjectRef}, Reason: reason})
				}
				continue
			}
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
	sort.Slice(readers, func(i, j int) bool { return readers[i].Objects[0].Name < readers[j].Objects[0].Name })
	sort.Slice(suspects, func(i, j int) bool { return suspects[i].key() < suspects[j].key() })
	return slices.Concat(expired, ghosts, orphans, readers), suspects
}

// readerReason says why the home reader o is deleted ("" while it may
// still serve a download).
func readerReason(now time.Time, o Object) string {
	switch {
	case o.Down != "":
		return fmt.Sprintf("home reader %s %s", o.Name, o.Down)
	case now.Sub(o.CreatedAt) > HomeReaderStart+HomeReaderLifetime:
		return fmt.Sprintf("home reader %s made at %s, longer ago than a download may last (%s)",
			o.Name, o.CreatedAt.UTC().Format(time.RFC3339), HomeReaderStart+HomeReaderLifetime)
	}
	return ""
}

// ghostReason says why s is a ghost ("" if it is not) and lists the
// troubles this look saw on it, each with the Since of the suspect in seen
// it continues.
func ghostReason(now time.Time, s session.Session, inv *Inventory, seen map[string]Suspect, r Rules) (string, []Suspect) {
	age := now.Sub(s.StartedAt)
	running := s.Status == session.StatusRunning
	timedOut := s.Status == session.StatusProvisioning && r.ProvisionTimeout > 0 && age > r.ProvisionTimeout
	pastGrace := running || age > r.ProvisionGrace
	allReady := true
	var troubles []Suspect
	reason := ""
	// suspect records a trouble of a running session's object and reports
	// whether the looks have now confirmed it.
	suspect := func(kind, name string, t Trouble, detail string) bool {
		sus := Suspect{Session: s.ID, Object: kind + "/" + name, Trouble: t, Detail: detail, Since: now}
		earlier, ok := seen[sus.key()]
		if ok && earlier.Since.Before(now) {
			sus.Since = earlier.Since
		}
		troubles = append(troubles, sus)
		lasted := now.Sub(sus.Since)
		if t == Missing {
			return ok && lasted >= r.AbsentConfirm
		}
		return lasted >= r.DownGrace
	}
	confirm := func(kind, name string, t Trouble, detail string) {
		if !suspect(kind, name, t, detail) || reason != "" {
			return
		}
		since := troubles[len(troubles)-1].Since.UTC().Format(time.RFC3339)
		if t == Missing {
			reason = fmt.Sprintf("%s %s missing at every look since %s", kind, name, since)
		} else {
			reason = fmt.Sprintf("%s %s %s since %s", kind, name, detail, since)
		}
	}
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
			switch {
			case !ok && running:
				confirm(string(session.KindPod), name, Missing, "")
			case !ok && pastGrace:
				return fmt.Sprintf("workspace Pod %s no longer exists", name), nil
			case ok && running && pod.Down != "":
				confirm(string(session.KindPod), name, Down, pod.Down)
			}
			allReady = allReady && ok && pod.Ready
		}
	} else {
		for _, n := range s.Nodes {
			name := session.NodeName(s.ID, n.Name)
			if !inv.VMNames[name] {
				if pastGrace {
					return fmt.Sprintf("VirtualMachine %s no longer exists", name), nil
				}
				allReady = false
				continue
			}
			vmi, ok := inv.VMIs[name]
			if running {
				if !ok {
					confirm("VirtualMachineInstance", name, Missing, "")
				}
				if down := inv.VMDown[name]; down != "" {
					confirm(string(session.KindVirtualMachine), name, Down, down)
				}
			}
			allReady = allReady && ok && vmi.Ready
		}
	}
	if reason != "" {
		return reason, troubles
	}
	// A provisioning row whose nodes are all ready only waits for someone
	// to read it (getSession marks it running): never a ghost.
	if timedOut && !allReady {
		return fmt.Sprintf("did not become ready within %s", r.ProvisionTimeout), troubles
	}
	return "", troubles
}
