// Package labs parses and validates lab templates: the YAML file (a
// ConfigMap in the cluster) that says what a student gets when they open a
// lab. Every template is validated when the file is loaded, so a typo fails
// the deployment at start instead of a student's session at open time.
//
// The live catalog reports what it puts in force and what it refuses
// through Metrics, an interface the entry points implement (functions/app
// with Prometheus), so the domain depends on no metrics library.
package labs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// Kind is what a lab runs on.
type Kind string

const (
	// KindVM labs run one KubeVirt VirtualMachine per node.
	KindVM Kind = "vm"
	// KindPod labs run one workspace Pod (user container + guardian sidecar).
	KindPod Kind = "pod"
)

// Defaults applied to nodes that leave CPU or memory empty. VM memory is
// requested and limited alike, so it is never overcommitted.
const (
	DefaultVMMemory  = "4Gi"
	DefaultPodMemory = "1Gi"
	DefaultCPU       = "1"
	DefaultSSHPort   = 22
)

// SSHUser is who a student logs in as on every node, and so whose
// authorized_keys a session's keys are written into: root, the whole point
// of a lab.
const SSHUser = "root"

// Lab is one validated template.
type Lab struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Kind        Kind   `json:"kind"`
	// Nodes are expanded (count applied) and carry defaults; at least one.
	// Pod labs have exactly one.
	Nodes []Node `json:"nodes"`
	// Disk is the boot disk of every VM node (vm labs only).
	Disk Disk `json:"disk,omitempty"`
	// Image is the workspace container image (pod labs only).
	Image string `json:"image,omitempty"`
	// SSHPort is where students reach each node over SSH.
	SSHPort int32 `json:"sshPort,omitempty"`
	// Capabilities are what a pod lab's workspace container gets on top of
	// the workspace set every workspace has (infra/guardian/workspace-pod.yaml):
	// only names of OptInCapabilities, each at most once. Most labs need
	// none; a networking lab asks for NET_RAW (ping, traceroute, tcpdump).
	Capabilities []string `json:"capabilities,omitempty"`
	// Readiness is when a VM node counts as running (vm labs only; default
	// TCP on SSHPort): see Readiness.
	Readiness *Readiness `json:"readiness,omitempty"`
	// Home is the student's volume that outlives sessions (see Home); nil
	// keeps nothing.
	Home *Home `json:"home,omitempty"`
}

// OptInCapabilities are the capabilities a pod lab may ask for beyond the
// workspace set. NET_RAW is left out of the workspace set because raw
// sockets let root forge packets (ARP and DNS spoofing on the Pod network)
// and it is only needed for ping-like tools; a lab that teaches them opts
// in. The sessions namespace's admission policy
// (infra/base/admission-policy.yaml) admits the workspace set plus these.
var OptInCapabilities = []string{"NET_RAW"}

// Node is one machine of a lab.
type Node struct {
	// Name is unique in the lab and part of every object name, so it is a
	// short DNS label (at most 15 characters).
	Name string `json:"name,omitempty"`
	// Role is what the node is for, e.g. control or worker; it becomes the
	// labkeep.io/role label.
	Role string `json:"role"`
	// Count expands one entry into Count nodes named <role>-1..<role>-N.
	// Only used while loading; expanded nodes have Count 0.
	Count int `json:"count,omitempty"`
	// CPU and Memory are Kubernetes quantities; requests equal limits.
	CPU    string `json:"cpu,omitempty"`
	Memory string `json:"memory,omitempty"`
}

// Disk is where a VM's root disk comes from: exactly one of the two.
type Disk struct {
	// ContainerDisk is an image with the disk inside (ephemeral).
	ContainerDisk string `json:"containerDisk,omitempty"`
	// GoldenPVC is cloned per node through the VM's dataVolumeTemplates.
	GoldenPVC *GoldenPVC `json:"goldenPVC,omitempty"`
}

// GoldenPVC names a prepared PVC that CDI clones for each VM.
type GoldenPVC struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Size      string `json:"size"`
	// StorageClassName is optional; empty uses the cluster default.
	StorageClassName string `json:"storageClassName,omitempty"`
}

// Catalog is the validated set of labs, looked up by name.
type Catalog struct {
	byName map[string]Lab
}

type file struct {
	Labs []Lab `json:"labs"`
}

// LoadFile reads and validates the lab templates file at path.
func LoadFile(path string) (*Catalog, error) {
	c, _, err := read(path)
	return c, err
}

// Parse validates a lab templates document:
//
//	labs:
//	- name: k8s-cluster
//	  kind: vm
//	  nodes: [{role: control}, {role: worker, count: 2}]
//	  disk: {containerDisk: quay.io/containerdisks/fedora:41}
//
// Unknown fields are errors (a misspelt "memroy" must not silently become
// the default). Returns an error naming the lab and field at fault.
func Parse(data []byte) (*Catalog, error) {
	var f file
	jsonData, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(jsonData))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, err
	}
	if len(f.Labs) == 0 {
		return nil, fmt.Errorf("no labs defined")
	}
	c := &Catalog{byName: map[string]Lab{}}
	for i, l := range f.Labs {
		l, err := normalise(l)
		if err != nil {
			return nil, fmt.Errorf("labs[%d] %q: %w", i, l.Name, err)
		}
		if _, dup := c.byName[l.Name]; dup {
			return nil, fmt.Errorf("labs[%d]: duplicate lab name %q", i, l.Name)
		}
		c.byName[l.Name] = l
	}
	return c, nil
}

// Get returns the lab called name and whether it exists.
func (c *Catalog) Get(name string) (Lab, bool) {
	l, ok := c.byName[name]
	return l, ok
}

// Names lists every lab name, sorted, for "unknown lab" errors.
func (c *Catalog) Names() []string {
	names := make([]string, 0, len(c.byName))
	for n := range c.byName {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// VMCount is how many VirtualMachines one session of the lab creates; this
// is what the lab costs against the concurrent-VM capacity.
func (l Lab) VMCount() int {
	if l.Kind != KindVM {
		return 0
	}
	return len(l.Nodes)
}

func normalise(l Lab) (Lab, error) {
	if errs := validation.IsDNS1123Label(l.Name); len(errs) > 0 {
		return l, fmt.Errorf("name: %s", strings.Join(errs, "; "))
	}
	if l.SSHPort == 0 {
		l.SSHPort = DefaultSSHPort
	}
	if l.SSHPort < 1 || l.SSHPort > 65535 {
		return l, fmt.Errorf("sshPort %d out of range", l.SSHPort)
	}
	defaultMemory := DefaultVMMemory
	switch l.Kind {
	case KindVM:
		hasCD, hasPVC := l.Disk.ContainerDisk != "", l.Disk.GoldenPVC != nil
		if hasCD == hasPVC {
			return l, fmt.Errorf("disk: set exactly one of containerDisk or goldenPVC")
		}
		if l.Image != "" {
			return l, fmt.Errorf("image: only pod labs have an image; vm labs use disk")
		}
		if len(l.Capabilities) > 0 {
			return l, fmt.Errorf("capabilities: only pod labs have a workspace container to grant them to")
		}
		if g := l.Disk.GoldenPVC; g != nil {
			if g.Name == "" || g.Namespace == "" {
				return l, fmt.Errorf("disk.goldenPVC: name and namespace are required")
			}
			if _, err := resource.ParseQuantity(g.Size); err != nil {
				return l, fmt.Errorf("disk.goldenPVC.size %q: %w", g.Size, err)
			}
		}
	case KindPod:
		defaultMemory = DefaultPodMemory
		if l.Image == "" {
			return l, fmt.Errorf("image: required for pod labs")
		}
		if l.Disk != (Disk{}) {
			return l, fmt.Errorf("disk: only vm labs have a disk")
		}
		for i, c := range l.Capabilities {
			if !slices.Contains(OptInCapabilities, c) {
				return l, fmt.Errorf("capabilities[%d] %q: a lab may only ask for %s", i, c, strings.Join(OptInCapabilities, ", "))
			}
			if slices.Contains(l.Capabilities[:i], c) {
				return l, fmt.Errorf("capabilities[%d] %q: listed twice", i, c)
			}
		}
	default:
		return l, fmt.Errorf("kind %q: must be %q or %q", l.Kind, KindVM, KindPod)
	}
	if err := normaliseReadiness(&l); err != nil {
		return l, err
	}
	var nodes []Node
	for i, n := range l.Nodes {
		if n.Role == "" {
			return l, fmt.Errorf("nodes[%d]: role is required", i)
		}
		if n.Count < 0 {
			return l, fmt.Errorf("nodes[%d]: count must not be negative", i)
		}
		if n.CPU == "" {
			n.CPU = DefaultCPU
		}
		if n.Memory == "" {
			n.Memory = defaultMemory
		}
		for field, q := range map[string]string{"cpu": n.CPU, "memory": n.Memory} {
			v, err := resource.ParseQuantity(q)
			if err != nil {
				return l, fmt.Errorf("nodes[%d].%s %q: %w", i, field, q, err)
			}
			if v.Sign() <= 0 {
				return l, fmt.Errorf("nodes[%d].%s %q: must be positive", i, field, q)
			}
		}
		if n.Count > 1 {
			if n.Name != "" {
				return l, fmt.Errorf("nodes[%d]: set name or count, not both", i)
			}
			for k := 1; k <= n.Count; k++ {
				m := n
				m.Count, m.Name = 0, fmt.Sprintf("%s-%d", n.Role, k)
				nodes = append(nodes, m)
			}
			continue
		}
		n.Count = 0
		if n.Name == "" {
			n.Name = n.Role
		}
		nodes = append(nodes, n)
	}
	if len(nodes) == 0 {
		return l, fmt.Errorf("nodes: at least one node is required")
	}
	if l.Kind == KindPod && len(nodes) != 1 {
		return l, fmt.Errorf("nodes: a pod lab has exactly one node, got %d", len(nodes))
	}
	seen := map[string]bool{}
	for _, n := range nodes {
		if errs := validation.IsDNS1123Label(n.Name); len(errs) > 0 || len(n.Name) > 15 {
			return l, fmt.Errorf("node name %q: must be a DNS label of at most 15 characters", n.Name)
		}
		if errs := validation.IsValidLabelValue(n.Role); len(errs) > 0 {
			return l, fmt.Errorf("node role %q: %s", n.Role, strings.Join(errs, "; "))
		}
		if seen[n.Name] {
			return l, fmt.Errorf("node name %q used twice", n.Name)
		}
		seen[n.Name] = true
	}
	l.Nodes = slices.Clip(nodes)
	if l.Home != nil {
		h := *l.Home // the caller's template stays as it was written
		l.Home = &h
	}
	if err := normaliseHome(&l); err != nil {
		return l, err
	}
	return l, nil
}
