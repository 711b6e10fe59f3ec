package session

import (
	"sort"

	"labkeep/shared/labs"
)

// ObjectKind is a kind of cluster object a session owns.
type ObjectKind string

// The kinds of objects a session can own.
const (
	KindVirtualMachine ObjectKind = "VirtualMachine"
	KindPod            ObjectKind = "Pod"
	KindService        ObjectKind = "Service"
	KindNetworkPolicy  ObjectKind = "NetworkPolicy"
	KindSecret         ObjectKind = "Secret"
	// KindAnchor is the session's deadline anchor Job, which owns every
	// other object of the session.
	KindAnchor ObjectKind = "Job"
)

// deleteOrder is the one order in which a session's objects are deleted,
// by whoever deletes them (a close, a failed open, the reaper, an orphan
// sweep): what runs first (VMs, the workspace Pod), then the Service, then
// the cloud-init Secrets, then the NetworkPolicy, and the anchor last — so
// a running VM is never left without the owner whose deadline would
// reclaim it, and a node's confinement goes as late as possible: a deleted
// Pod keeps running through its grace period, and a policy deleted before
// it would leave it unconfined meanwhile.
var deleteOrder = map[ObjectKind]int{
	KindVirtualMachine: 0,
	KindPod:            0,
	KindService:        1,
	KindSecret:         2,
	KindNetworkPolicy:  3,
	KindAnchor:         4,
}

// SortForDelete orders refs in the delete order, keeping the given order
// among objects of the same rank. Kinds it does not know go last.
func SortForDelete(refs []ObjectRef) {
	rank := func(k ObjectKind) int {
		if r, ok := deleteOrder[k]; ok {
			return r
		}
		return len(deleteOrder)
	}
	sort.SliceStable(refs, func(i, j int) bool { return rank(refs[i].Kind) < rank(refs[j].Kind) })
}

// ObjectRef names one object in the sessions namespace. UID, if set, names
// exactly that object, never a newer one of the same name.
type ObjectRef struct {
	Kind ObjectKind
	Name string
	UID  string
}

// String is kind/name, as reports and logs show an object.
func (r ObjectRef) String() string { return string(r.Kind) + "/" + r.Name }

// Object names. Every name contains the session id, so a new session can
// never pick up an old session's objects (in particular its cloud-init), and
// everything a session owns can be found by name without a list call.

// AnchorName is the deadline anchor Job of a session.
func AnchorName(sessionID string) string { return "lk-" + sessionID + "-anchor" }

// NodeName is the VirtualMachine (or workspace Pod) of one node.
func NodeName(sessionID, node string) string { return "lk-" + sessionID + "-" + node }

// CloudInitName is the cloud-init Secret of one node.
func CloudInitName(sessionID, node string) string {
	return "lk-" + sessionID + "-" + node + "-cloudinit"
}

// SSHKeysName is the Secret holding the SSH public keys a running VM of
// one node takes through its guest agent (KubeVirt accessCredentials), so
// a key can reach a VM that booted before its student existed (a warm-pool
// instance). Like the cloud-init Secret it is owned by the anchor and goes
// with it, never by name.
func SSHKeysName(sessionID, node string) string {
	return "lk-" + sessionID + "-" + node + "-ssh-keys"
}

// NetworkName is the NetworkPolicy of a session and the Service of a
// multi-node session.
func NetworkName(sessionID string) string { return "lk-" + sessionID }

// Objects lists, by name and in the delete order, every object s can own:
// one VM or workspace Pod per node, the Service of a multi-node session,
// one cloud-init Secret per node, the NetworkPolicy every session has, and
// the anchor.
func Objects(s Session) []ObjectRef {
	node := KindVirtualMachine
	if s.Kind == labs.KindPod {
		node = KindPod
	}
	var refs []ObjectRef
	for _, n := range s.Nodes {
		refs = append(refs, ObjectRef{Kind: node, Name: NodeName(s.ID, n.Name)})
		refs = append(refs, ObjectRef{Kind: KindSecret, Name: CloudInitName(s.ID, n.Name)})
	}
	if len(s.Nodes) > 1 {
		refs = append(refs, ObjectRef{Kind: KindService, Name: NetworkName(s.ID)})
	}
	refs = append(refs,
		ObjectRef{Kind: KindNetworkPolicy, Name: NetworkName(s.ID)},
		ObjectRef{Kind: KindAnchor, Name: AnchorName(s.ID)})
	SortForDelete(refs)
	return refs
}
