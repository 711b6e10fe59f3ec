package kube

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/util/intstr"

	"labkeep/shared/labs"
)

// Every VM carries a TCP readinessProbe, so its VMI is Ready only once a
// student can log in: on the SSH port by default, or where the catalog
// says.
func TestVMReadinessProbe(t *testing.T) {
	type probe struct {
		Port          intstr.IntOrString
		Delay, Period int32
	}
	tests := []struct {
		name      string
		readiness *labs.Readiness
		sshPort   int32
		want      probe
	}{
		{"default: the SSH port", nil, 22, probe{Port: intstr.FromInt32(22)}},
		{"default follows a lab's own SSH port", nil, 2200, probe{Port: intstr.FromInt32(2200)}},
		{"the catalog's port and timing", &labs.Readiness{TCPPort: 8022, InitialDelaySeconds: 5, PeriodSeconds: 3}, 22,
			probe{Port: intstr.FromInt32(8022), Delay: 5, Period: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := testBuilder(t, "linux")
			b.lab.SSHPort, b.lab.Readiness = tt.sshPort, tt.readiness
			for _, n := range b.lab.Nodes {
				p := b.vm(n, b.anchor()).Spec.Template.Spec.ReadinessProbe
				if p == nil || p.TCPSocket == nil {
					t.Fatalf("VM %s has no TCP readinessProbe: %+v", n.Name, p)
				}
				got := probe{Port: p.TCPSocket.Port, Delay: p.InitialDelaySeconds, Period: p.PeriodSeconds}
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("probe (-want +got):\n%s", diff)
				}
			}
		})
	}
}
