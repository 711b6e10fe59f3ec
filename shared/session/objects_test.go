package session

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/labs"
)

// Every session has its NetworkPolicy, a multi-node one its Service too;
// the nodes go first, the policy after everything but the anchor (a
// deleted node runs on through its grace period, still confined), the
// anchor last.
func TestObjects(t *testing.T) {
	tests := []struct {
		name  string
		kind  labs.Kind
		nodes []string
		want  []string
	}{
		{"pod lab", labs.KindPod, []string{"workspace"}, []string{
			"Pod/lk-s-workspace", "Secret/lk-s-workspace-cloudinit", "NetworkPolicy/lk-s", "Job/lk-s-anchor"}},
		{"single VM", labs.KindVM, []string{"vm"}, []string{
			"VirtualMachine/lk-s-vm", "Secret/lk-s-vm-cloudinit", "NetworkPolicy/lk-s", "Job/lk-s-anchor"}},
		{"multi-node", labs.KindVM, []string{"a", "b"}, []string{
			"VirtualMachine/lk-s-a", "VirtualMachine/lk-s-b", "Service/lk-s",
			"Secret/lk-s-a-cloudinit", "Secret/lk-s-b-cloudinit", "NetworkPolicy/lk-s", "Job/lk-s-anchor"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := Session{ID: "s", Kind: tc.kind}
			for _, n := range tc.nodes {
				s.Nodes = append(s.Nodes, Node{Name: n})
			}
			var got []string
			for _, r := range Objects(s) {
				got = append(got, r.String())
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("objects (-want +got):\n%s", diff)
			}
		})
	}
}
