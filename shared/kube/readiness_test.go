package kube

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	kubevirtv1 "kubevirt.io/api/core/v1"

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

// A node held back by the scheduler says why, from the Pod's own
// PodScheduled=False condition or, for a VM, the one virt-controller copies
// from its virt-launcher Pod to the VMI; other conditions say nothing.
func TestNodeStateSaysWhyItCannotBePlaced(t *testing.T) {
	const why = "0/1 nodes are available: 1 Insufficient cpu."
	tests := []struct {
		name        string
		status      corev1.ConditionStatus
		reason, msg string
		want        string
	}{
		{"the scheduler's message", corev1.ConditionFalse, "Unschedulable", why, why},
		{"a reason without a message", corev1.ConditionFalse, "SchedulingGated", "", "SchedulingGated"},
		{"neither", corev1.ConditionFalse, "", "", "the cluster has not placed it yet"},
		{"placed", corev1.ConditionTrue, "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{
				{Type: corev1.PodReady, Status: corev1.ConditionFalse, Message: "not this one"},
				{Type: corev1.PodScheduled, Status: tt.status, Reason: tt.reason, Message: tt.msg},
			}}}
			vmi := &kubevirtv1.VirtualMachineInstance{Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Scheduling, Conditions: []kubevirtv1.VirtualMachineInstanceCondition{
				{Type: kubevirtv1.VirtualMachineInstanceReady, Status: corev1.ConditionFalse, Message: "not this one"},
				{Type: kubevirtv1.VirtualMachineInstanceConditionType(corev1.PodScheduled), Status: tt.status, Reason: tt.reason, Message: tt.msg},
			}}}
			got := []string{PodState("n", pod).Unschedulable, VMIState("n", vmi).Unschedulable}
			if diff := cmp.Diff([]string{tt.want, tt.want}, got); diff != "" {
				t.Errorf("unschedulable of Pod, VMI (-want +got):\n%s", diff)
			}
		})
	}
}
