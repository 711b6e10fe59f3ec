package labs

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const good = `
labs:
- name: linux-basics
  kind: vm
  nodes: [{role: vm}]
  disk: {containerDisk: quay.io/containerdisks/fedora:41}
- name: k8s-cluster
  kind: vm
  nodes:
  - {role: control, cpu: "2"}
  - {role: worker, count: 2, memory: 2Gi}
  disk:
    goldenPVC: {name: ubuntu-golden, namespace: golden, size: 20Gi}
- name: shell
  kind: pod
  image: docker.io/library/debian:12
  nodes: [{role: workspace, memory: 512Mi}]
  sshPort: 2222
`

func TestParseExpandsAndDefaults(t *testing.T) {
	c, err := Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"k8s-cluster", "linux-basics", "shell"}, c.Names()); diff != "" {
		t.Errorf("Names (-want +got):\n%s", diff)
	}
	k8s, _ := c.Get("k8s-cluster")
	want := []Node{
		{Name: "control", Role: "control", CPU: "2", Memory: "4Gi"},
		{Name: "worker-1", Role: "worker", CPU: "1", Memory: "2Gi"},
		{Name: "worker-2", Role: "worker", CPU: "1", Memory: "2Gi"},
	}
	if diff := cmp.Diff(want, k8s.Nodes); diff != "" {
		t.Errorf("k8s-cluster nodes (-want +got):\n%s", diff)
	}
	if k8s.VMCount() != 3 || k8s.SSHPort != 22 {
		t.Errorf("k8s-cluster VMCount=%d SSHPort=%d, want 3 and 22", k8s.VMCount(), k8s.SSHPort)
	}
	shell, _ := c.Get("shell")
	if shell.VMCount() != 0 || shell.SSHPort != 2222 || shell.Nodes[0].Memory != "512Mi" {
		t.Errorf("shell = %+v", shell)
	}
	if _, ok := c.Get("nope"); ok {
		t.Error("Get(nope) found a lab")
	}
}

func TestParseRejects(t *testing.T) {
	tests := []struct {
		name, doc, wantErr string
	}{
		{"empty file", ``, "no labs"},
		{"unknown field", `labs: [{name: a, kind: vm, nodes: [{role: x, memroy: 1Gi}], disk: {containerDisk: i}}]`, "memroy"},
		{"bad kind", `labs: [{name: a, kind: lxc, nodes: [{role: x}]}]`, "kind"},
		{"bad lab name", `labs: [{name: A_B, kind: vm, nodes: [{role: x}], disk: {containerDisk: i}}]`, "name"},
		{"no nodes", `labs: [{name: a, kind: vm, disk: {containerDisk: i}}]`, "at least one node"},
		{"vm without disk", `labs: [{name: a, kind: vm, nodes: [{role: x}]}]`, "disk"},
		{"vm with two disks", `labs: [{name: a, kind: vm, nodes: [{role: x}], disk: {containerDisk: i, goldenPVC: {name: g, namespace: golden, size: 1Gi}}}]`, "exactly one"},
		{"pod without image", `labs: [{name: a, kind: pod, nodes: [{role: x}]}]`, "image"},
		{"pod with two nodes", `labs: [{name: a, kind: pod, image: i, nodes: [{role: x, count: 2}]}]`, "exactly one"},
		{"bad memory", `labs: [{name: a, kind: vm, nodes: [{role: x, memory: lots}], disk: {containerDisk: i}}]`, "memory"},
		{"zero cpu", `labs: [{name: a, kind: vm, nodes: [{role: x, cpu: "0"}], disk: {containerDisk: i}}]`, "positive"},
		{"duplicate node names", `labs: [{name: a, kind: vm, nodes: [{role: x}, {role: x}], disk: {containerDisk: i}}]`, "used twice"},
		{"long node name", `labs: [{name: a, kind: vm, nodes: [{role: averyveryverylongrole}], disk: {containerDisk: i}}]`, "15 characters"},
		{"duplicate lab", `labs: [{name: a, kind: pod, image: i, nodes: [{role: x}]}, {name: a, kind: pod, image: i, nodes: [{role: x}]}]`, "duplicate"},
		{"bad ssh port", `labs: [{name: a, kind: pod, image: i, sshPort: 70000, nodes: [{role: x}]}]`, "sshPort"},
		{"a capability beyond the opt-in ones", `labs: [{name: a, kind: pod, image: i, capabilities: [SYS_ADMIN], nodes: [{role: x}]}]`, `"SYS_ADMIN": a lab may only ask for NET_RAW`},
		{"a capability spelt with CAP_", `labs: [{name: a, kind: pod, image: i, capabilities: [CAP_NET_RAW], nodes: [{role: x}]}]`, "a lab may only ask for NET_RAW"},
		{"a capability twice", `labs: [{name: a, kind: pod, image: i, capabilities: [NET_RAW, NET_RAW], nodes: [{role: x}]}]`, "listed twice"},
		{"capabilities on a vm lab", `labs: [{name: a, kind: vm, capabilities: [NET_RAW], nodes: [{role: x}], disk: {containerDisk: i}}]`, "only pod labs"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Parse error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// A pod lab opts in to NET_RAW; labs that say nothing get no capability
// beyond the workspace set.
func TestParseCapabilityOptIn(t *testing.T) {
	c, err := Parse([]byte(`
labs:
- {name: net, kind: pod, image: i, capabilities: [NET_RAW], nodes: [{role: x}]}
- {name: plain, kind: pod, image: i, nodes: [{role: x}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, name := range c.Names() {
		l, _ := c.Get(name)
		got[name] = l.Capabilities
	}
	if diff := cmp.Diff(map[string][]string{"net": {"NET_RAW"}, "plain": nil}, got); diff != "" {
		t.Errorf("capabilities by lab (-want +got):\n%s", diff)
	}
}
