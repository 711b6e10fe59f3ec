package session

import (
	"context"

	"labkeep/shared/labs"
)

// capacity is what one open of a lab takes from the shared hardware, and
// how it is counted: VM labs count VirtualMachines against MaxVMs, pod
// labs workspace Pods against MaxPods. Both are counted under the one
// capacity lock, so concurrent opens of either kind cannot all see room.
type capacity struct {
	what  string // "VMs" or "workspace Pods", for the refusal
	need  int
	limit int
	count func(ctx context.Context) (int, error)
}

func (s *Service) capacityFor(lab labs.Lab) capacity {
	if lab.Kind == labs.KindPod {
		return capacity{what: "workspace Pods", need: len(lab.Nodes), limit: s.Limits.MaxPods, count: s.Cluster.CountWorkspacePods}
	}
	return capacity{what: "VMs", need: lab.VMCount(), limit: s.Limits.MaxVMs, count: s.Cluster.CountVMs}
}
