package guard

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

// The holder of guardian's API port in the workspace is killed whatever
// protection it would otherwise have, except the verified sshd listener;
// nothing is killed before the workspace cgroup is known.
func TestReclaimPort(t *testing.T) {
	tests := []struct {
		name      string
		holder    int  // PID holding the port (fakeProcs.listener)
		attached  bool // a workspace cgroup is guarded
		wantErr   error
		wantKills []int
		wantAlert string
	}{
		{"an unprotected process is killed", 41, true, nil, []int{41}, "api-port-taken"},
		{"the container's init is killed too", 7, true, nil, []int{7}, "api-port-taken"},
		{"the verified sshd listener is only alerted", 20, true, errPortHolderUnknown, nil, "api-port-sshd"},
		{"no workspace yet: nothing is killed", 41, false, ErrNoWorkspace, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r *rig
			if tt.attached {
				r = newRig(t, testConfig())
			} else {
				r = newStartedRig(t, testConfig(), func(*rig) {})
			}
			r.procs.mu.Lock()
			r.procs.listener = tt.holder
			r.procs.mu.Unlock()
			if err := r.g.reclaimPort(context.Background(), 9090); !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Errorf("reclaimPort() = %v; want %v", err, tt.wantErr)
			}
			var kills []int
			for _, c := range r.killer.calls {
				if c.Sig == unix.SIGTERM || c.Sig == unix.SIGKILL {
					kills = append(kills, c.PID)
				}
			}
			if diff := cmp.Diff(tt.wantKills, kills); diff != "" {
				t.Errorf("killed (-want +got):\n%s", diff)
			}
			if tt.wantAlert != "" {
				found := false
				for _, a := range r.alerts.Recent() {
					if a.Kind == tt.wantAlert {
						found = a.Fields["pid"] != "" && a.Fields["port"] == "9090"
					}
				}
				if !found {
					t.Errorf("alerts %v; want %s naming the holder and the port", r.alertKinds(), tt.wantAlert)
				}
			}
		})
	}
}
