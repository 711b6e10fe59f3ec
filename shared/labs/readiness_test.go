package labs

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A vm lab always has a readiness (TCP on its SSH port unless it says
// otherwise); a pod lab may not set one; bad values are refused.
func TestReadiness(t *testing.T) {
	const vm = "labs:\n- {name: l, kind: vm, nodes: [{role: vm}], disk: {containerDisk: fedora}"
	tests := []struct {
		name    string
		doc     string
		want    *Readiness
		wantErr string
	}{
		{"vm lab defaults to TCP 22", vm + "}", &Readiness{TCPPort: 22}, ""},
		{"vm lab defaults to its own SSH port", vm + ", sshPort: 2200}", &Readiness{TCPPort: 2200}, ""},
		{"vm lab sets port and timing", vm + ", readiness: {tcpPort: 8022, initialDelaySeconds: 5, periodSeconds: 2}}",
			&Readiness{TCPPort: 8022, InitialDelaySeconds: 5, PeriodSeconds: 2}, ""},
		{"vm lab sets timing only", vm + ", readiness: {periodSeconds: 2}}", &Readiness{TCPPort: 22, PeriodSeconds: 2}, ""},
		{"port out of range", vm + ", readiness: {tcpPort: 70000}}", nil, "readiness.tcpPort 70000 out of range"},
		{"negative period", vm + ", readiness: {periodSeconds: -1}}", nil, "readiness.periodSeconds must not be negative"},
		{"misspelt field", vm + ", readiness: {tcpPrt: 22}}", nil, "unknown field"},
		{"pod lab", "labs:\n- {name: p, kind: pod, image: debian, nodes: [{role: w}], readiness: {tcpPort: 22}}", nil, "readiness: only vm labs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cat, err := Parse([]byte(tt.doc))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			l, _ := cat.Get(cat.Names()[0])
			if diff := cmp.Diff(tt.want, l.Readiness); diff != "" {
				t.Errorf("readiness (-want +got):\n%s", diff)
			}
		})
	}
}
