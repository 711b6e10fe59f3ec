package reap

import (
	"time"

	"labkeep/shared/session"
)

// Object is one labelled object of the sessions namespace, as a run sees
// it.
type Object struct {
	session.ObjectRef
	// Env, Session and Role are the object's labkeep.io labels.
	Env, Session, Role string
	CreatedAt          time.Time
	// Deleting is true if the object already has a deletion timestamp.
	Deleting bool
	// Ready is, for a workspace Pod, whether it is Running with condition
	// Ready=True (false for every other kind).
	Ready bool
	// Down is, for a Pod, why it will never run again (it has ended:
	// phase Failed or Succeeded), or empty.
	Down string
	// HomeReader is true for a home reader Pod (HomeReader items), which
	// belongs to no session.
	HomeReader bool
}

// VMIInfo is one VirtualMachineInstance (any labels).
type VMIInfo struct {
	Name  string
	Ready bool
}

// Inventory is a snapshot of the sessions namespace, read with one list
// call per kind however many sessions exist.
type Inventory struct {
	// Objects are this environment's labelled objects (label labkeep.io/env
	// equal to the reaper's) of every kind but Secrets, which are never
	// read and go with their anchor. Objects of other environments and
	// unlabelled ones are never included, so they are never touched.
	Objects []Object
	// VMs is the number of VirtualMachines in the namespace, any label or
	// none: the number that counts against capacity.
	VMs int
	// VMNames are the names of all those VirtualMachines, labelled or not,
	// so a session whose VM lacks labels is never taken for a ghost.
	VMNames map[string]bool
	// VMIs are all VirtualMachineInstances by name (VMI name = VM name).
	VMIs map[string]VMIInfo
	// VMDown are the VirtualMachines KubeVirt reports as not running and
	// not on their way to running (stopped, crash-looping, unschedulable,
	// image or volume errors), by name, with what it reports.
	VMDown map[string]string
	// ListedAt is when the first list started; anything created later may
	// be missing from the snapshot.
	ListedAt time.Time
}
