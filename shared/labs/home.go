package labs

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Home asks for the student's home in a lab: a volume of the student's
// own that outlives every session, so what they saved under MountPath is
// there again at their next open of any lab with the same home. Everything
// else of a session still goes when it ends. A lab without a Home keeps
// nothing.
//
// A student has one home per environment and Group: labs that leave Group
// empty share the student's default home, labs of a course that names a
// Group share that one and never see the default.
type Home struct {
	// Size is the volume's capacity (a Kubernetes quantity) when the home
	// is first made; a home keeps the size it was made with.
	Size string `json:"size"`
	// MountPath is where the home appears: in the workspace container of a
	// pod lab, and in the VM of a vm lab (mounted by cloud-init).
	MountPath string `json:"mountPath"`
	// Group names a separate home for a course or lab group (a DNS label
	// of at most 20 characters, 17 for a vm lab; a pod lab's may not be
	// vm or start with vm-); empty is the student's default home. Pod
	// labs and vm labs never share a home (HomeGroup).
	Group string `json:"group,omitempty"`
	// Node is the vm lab node whose VM gets the home as a second disk
	// (a volume is attached to one VM at a time); default the first node.
	// Pod labs have one node and leave it empty.
	Node string `json:"node,omitempty"`
}

// MaxHomeGroup is the longest home group (HomeGroup): it is part of the
// home's object name and of a label value.
const MaxHomeGroup = 20

// vmHomes starts the home group of every vm lab (HomeGroup).
const vmHomes = "vm"

// HomeGroup is the group of the lab's home as the cluster knows it: a pod
// lab's Group; for a vm lab, vm or vm-<Group>. A pod lab's home holds the
// student's files, a vm lab's a disk image (KubeVirt's disk.img) with a
// file system inside, so the two kinds of lab never share one. Empty for
// a lab without a home.
func (l Lab) HomeGroup() string {
	switch {
	case l.Home == nil:
		return ""
	case l.Kind != KindVM:
		return l.Home.Group
	case l.Home.Group == "":
		return vmHomes
	}
	return vmHomes + "-" + l.Home.Group
}

// reservedMountPaths are the directories a home may not cover or sit
// in: the system's own, which the lab's image or the VM's disk provide
// and the platform relies on (sshd's keys come from /etc, the kernel's
// interfaces from /proc, /sys and /dev), and /tmp, which is cleared.
var reservedMountPaths = []string{"/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/run", "/sbin", "/sys", "/tmp", "/usr", "/var"}

// mountPathChars keeps a mount path usable unquoted in fstab and in
// cloud-init's mounts list.
var mountPathChars = regexp.MustCompile(`^[A-Za-z0-9._/-]+$`)

// normaliseHome checks the lab's home and names its vm node; a lab
// without one is left alone.
func normaliseHome(l *Lab) error {
	h := l.Home
	if h == nil {
		return nil
	}
	size, err := resource.ParseQuantity(h.Size)
	if err != nil {
		return fmt.Errorf("home.size %q: %w", h.Size, err)
	}
	if size.Sign() <= 0 {
		return fmt.Errorf("home.size %q: must be positive", h.Size)
	}
	if err := checkMountPath(h.MountPath); err != nil {
		return fmt.Errorf("home.mountPath %q: %w", h.MountPath, err)
	}
	if h.Group != "" {
		if errs := validation.IsDNS1123Label(h.Group); len(errs) > 0 || len(l.HomeGroup()) > MaxHomeGroup {
			return fmt.Errorf("home.group %q: must be a DNS label of at most %d characters (%d on a vm lab)", h.Group, MaxHomeGroup, MaxHomeGroup-len(vmHomes)-1)
		}
		if l.Kind == KindPod && (h.Group == vmHomes || strings.HasPrefix(h.Group, vmHomes+"-")) {
			return fmt.Errorf("home.group %q: %s and %s-… are the homes of vm labs, which hold disk images", h.Group, vmHomes, vmHomes)
		}
	}
	switch l.Kind {
	case KindPod:
		if h.Node != "" {
			return fmt.Errorf("home.node: only vm labs name the node that gets the home")
		}
	case KindVM:
		if h.Node == "" {
			h.Node = l.Nodes[0].Name
		}
		if !slices.ContainsFunc(l.Nodes, func(n Node) bool { return n.Name == h.Node }) {
			return fmt.Errorf("home.node %q: not a node of the lab", h.Node)
		}
	}
	return nil
}

// checkMountPath refuses what is not a clean absolute path outside the
// system's directories.
func checkMountPath(p string) error {
	switch {
	case !strings.HasPrefix(p, "/") || path.Clean(p) != p:
		return fmt.Errorf("must be a clean absolute path")
	case !mountPathChars.MatchString(p):
		return fmt.Errorf("may only hold letters, digits and . _ / -")
	case p == "/":
		return fmt.Errorf("must not cover the whole file system")
	}
	for _, r := range reservedMountPaths {
		if p == r || strings.HasPrefix(p, r+"/") {
			return fmt.Errorf("must not be in %s, a system directory", r)
		}
	}
	return nil
}
