package kube

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// vmDownStatuses are the printableStatus values with which KubeVirt
// reports a VirtualMachine as not running and not on its way to running:
// stopped (a VM that should run shows it between a guest poweroff and the
// new VMI, so the reaper waits out a grace), crash-looping, unschedulable,
// or stuck on its image or volumes. Starting, Provisioning, Migrating,
// Paused (the student's doing) and the transient statuses are not down.
var vmDownStatuses = map[kubevirtv1.VirtualMachinePrintableStatus]bool{
	kubevirtv1.VirtualMachineStatusStopped:          true,
	kubevirtv1.VirtualMachineStatusCrashLoopBackOff: true,
	kubevirtv1.VirtualMachineStatusUnschedulable:    true,
	kubevirtv1.VirtualMachineStatusErrImagePull:     true,
	kubevirtv1.VirtualMachineStatusImagePullBackOff: true,
	kubevirtv1.VirtualMachineStatusPvcNotFound:      true,
	kubevirtv1.VirtualMachineStatusDataVolumeError:  true,
}

// VMDown says how KubeVirt reports vm down (see vmDownStatuses, and a
// Failure condition that is True), or "" if it does not. A VM being
// deleted is not down: it is going.
func VMDown(vm *kubevirtv1.VirtualMachine) string {
	if vm.DeletionTimestamp != nil {
		return ""
	}
	if vmDownStatuses[vm.Status.PrintableStatus] {
		return "reported " + string(vm.Status.PrintableStatus)
	}
	for _, c := range vm.Status.Conditions {
		if c.Type == kubevirtv1.VirtualMachineFailure && c.Status == corev1.ConditionTrue {
			return fmt.Sprintf("reported failing (%s: %s)", c.Reason, c.Message)
		}
	}
	return ""
}

// PodDown says why a workspace Pod will never run again — it has ended
// (phase Failed or Succeeded; a bare Pod is never restarted once ended) —
// or "" if it has not.
func PodDown(pod *corev1.Pod) string {
	if pod.DeletionTimestamp != nil {
		return ""
	}
	switch pod.Status.Phase {
	case corev1.PodFailed, corev1.PodSucceeded:
		why := "ended (phase " + string(pod.Status.Phase)
		if pod.Status.Reason != "" {
			why += ", " + pod.Status.Reason
		}
		return why + ")"
	}
	return ""
}
