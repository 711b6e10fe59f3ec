package kube

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

func TestVMDown(t *testing.T) {
	now := metav1.Now()
	tests := []struct {
		name string
		vm   kubevirtv1.VirtualMachine
		want string
	}{
		{"running", kubevirtv1.VirtualMachine{Status: kubevirtv1.VirtualMachineStatus{PrintableStatus: kubevirtv1.VirtualMachineStatusRunning}}, ""},
		{"starting again after a poweroff", kubevirtv1.VirtualMachine{Status: kubevirtv1.VirtualMachineStatus{PrintableStatus: kubevirtv1.VirtualMachineStatusStarting}}, ""},
		{"paused by the student", kubevirtv1.VirtualMachine{Status: kubevirtv1.VirtualMachineStatus{PrintableStatus: kubevirtv1.VirtualMachineStatusPaused}}, ""},
		{"migrating", kubevirtv1.VirtualMachine{Status: kubevirtv1.VirtualMachineStatus{PrintableStatus: kubevirtv1.VirtualMachineStatusMigrating}}, ""},
		{"stopped", kubevirtv1.VirtualMachine{Status: kubevirtv1.VirtualMachineStatus{PrintableStatus: kubevirtv1.VirtualMachineStatusStopped}}, "reported Stopped"},
		{"crash-looping", kubevirtv1.VirtualMachine{Status: kubevirtv1.VirtualMachineStatus{PrintableStatus: kubevirtv1.VirtualMachineStatusCrashLoopBackOff}}, "reported CrashLoopBackOff"},
		{"unschedulable", kubevirtv1.VirtualMachine{Status: kubevirtv1.VirtualMachineStatus{PrintableStatus: kubevirtv1.VirtualMachineStatusUnschedulable}}, "reported ErrorUnschedulable"},
		{"failure condition", kubevirtv1.VirtualMachine{Status: kubevirtv1.VirtualMachineStatus{Conditions: []kubevirtv1.VirtualMachineCondition{
			{Type: kubevirtv1.VirtualMachineFailure, Status: corev1.ConditionTrue, Reason: "FailedCreate", Message: "quota"}}}}, "reported failing (FailedCreate: quota)"},
		{"being deleted", kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now},
			Status: kubevirtv1.VirtualMachineStatus{PrintableStatus: kubevirtv1.VirtualMachineStatusStopped}}, ""},
	}
	for _, tc := range tests {
		if got := VMDown(&tc.vm); got != tc.want {
			t.Errorf("%s: VMDown = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestPodDown(t *testing.T) {
	tests := []struct {
		name  string
		phase corev1.PodPhase
		want  string
	}{
		{"pending", corev1.PodPending, ""},
		{"running", corev1.PodRunning, ""},
		{"failed", corev1.PodFailed, "ended (phase Failed, Evicted)"},
		{"succeeded", corev1.PodSucceeded, "ended (phase Succeeded, Evicted)"},
	}
	for _, tc := range tests {
		pod := corev1.Pod{Status: corev1.PodStatus{Phase: tc.phase, Reason: "Evicted"}}
		if got := PodDown(&pod); got != tc.want {
			t.Errorf("%s: PodDown = %q, want %q", tc.name, got, tc.want)
		}
	}
}
