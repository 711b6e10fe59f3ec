package podlab_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"labkeep/localrun/stacktest"
)

// The node has room for one workspace: a second student's workspace Pod
// cannot be placed, and their session says so, with the scheduler's
// reason, instead of reading "scheduled" until the provision timeout. Once
// the first student closes, the scheduler places it and the session runs.
func TestWorkspaceWithoutRoomSaysWhy(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{})
	first := openLab(t, d, "room-1", "shell", nil)
	first.waitRunning(3 * time.Minute)
	second := openLab(t, d, "room-2", "shell", nil)
	var node stacktest.NodeView
	stacktest.Eventually(t, 2*time.Minute, func() (bool, string) {
		code, v := second.get()
		if code != http.StatusOK || len(v.Nodes) != 1 {
			return false, fmt.Sprintf("getSession %d %+v", code, v)
		}
		node = v.Nodes[0]
		return v.Status == "provisioning" && node.Phase == "unschedulable", fmt.Sprintf("session %s, node phase %q; Pod: %s", v.Status, node.Phase, second.podState())
	})
	if !strings.Contains(node.PhaseReason, "Insufficient cpu") {
		t.Errorf("phaseReason %q does not give the scheduler's reason (Insufficient cpu)", node.PhaseReason)
	}
	t.Logf("the second workspace: %s, %q", node.Phase, node.PhaseReason)
	first.close()
	v := second.waitRunning(3 * time.Minute)
	if v.Nodes[0].PhaseReason != "" {
		t.Errorf("the running session still gives a reason: %q", v.Nodes[0].PhaseReason)
	}
	second.close()
}
