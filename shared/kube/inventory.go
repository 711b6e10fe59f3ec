package kube

import (
	"context"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"labkeep/shared/reap"
	"labkeep/shared/session"
)

// Inventory lists the namespace: every VM and VMI, plus this environment's
// labelled Jobs, Services, NetworkPolicies and Pods — six list calls in
// all. It is what the reaper plans a run from.
//
// Secrets are not listed: a list returns their data, and the sessions
// namespace may be shared by environments (dev's ServiceAccount would read
// every prod student's grading token). The Role grants no read on Secrets
// at all. Every cloud-init Secret is owned by its session's anchor, so
// deleting the anchor (which Teardown and orphan handling do, with
// background propagation) lets the garbage collector reclaim it; nothing
// deletes them by name (their labels cannot be checked).
//
// Pods that KubeVirt runs for a VMI (virt-launcher Pods, which carry the
// VMI's labels) are left out: they belong to their VMI and go with it.
// Workspace Pods carry Ready (Running with condition Ready=True) and Down
// (PodDown); VMs KubeVirt reports down are in VMDown (see VMDown).
func (c *Cluster) Inventory(ctx context.Context) (reap.Inventory, error) {
	inv := reap.Inventory{ListedAt: time.Now(), VMIs: map[string]reap.VMIInfo{}, VMNames: map[string]bool{}, VMDown: map[string]string{}}
	envSel := metav1.ListOptions{LabelSelector: labels.SelectorFromSet(labels.Set{LabelEnv: c.cfg.Env}).String()}
	ns := c.cfg.Namespace
	add := func(kind session.ObjectKind, m metav1.ObjectMeta) *reap.Object {
		if m.Labels[LabelEnv] != c.cfg.Env {
			return nil
		}
		inv.Objects = append(inv.Objects, reap.Object{
			ObjectRef: session.ObjectRef{Kind: kind, Name: m.Name, UID: string(m.UID)},
			Env:       m.Labels[LabelEnv], Session: m.Labels[LabelSession], Role: m.Labels[LabelRole],
			CreatedAt: m.CreationTimestamp.Time, Deleting: m.DeletionTimestamp != nil,
		})
		return &inv.Objects[len(inv.Objects)-1]
	}
	vms, err := listWith(ctx, c, c.virt.KubevirtV1().VirtualMachines(ns).List, metav1.ListOptions{})
	if err != nil {
		return inv, fmt.Errorf("listing VirtualMachines: %w", err)
	}
	inv.VMs = len(vms.Items)
	for _, vm := range vms.Items {
		inv.VMNames[vm.Name] = true
		if why := VMDown(&vm); why != "" {
			inv.VMDown[vm.Name] = why
		}
		add(session.KindVirtualMachine, vm.ObjectMeta)
	}
	vmis, err := listWith(ctx, c, c.virt.KubevirtV1().VirtualMachineInstances(ns).List, metav1.ListOptions{})
	if err != nil {
		return inv, fmt.Errorf("listing VirtualMachineInstances: %w", err)
	}
	for i := range vmis.Items {
		st := VMIState("", &vmis.Items[i])
		inv.VMIs[vmis.Items[i].Name] = reap.VMIInfo{Name: vmis.Items[i].Name, Ready: st.Ready}
	}
	jobs, err := listWith(ctx, c, c.kube.BatchV1().Jobs(ns).List, envSel)
	if err != nil {
		return inv, fmt.Errorf("listing Jobs: %w", err)
	}
	for _, o := range jobs.Items {
		add(session.KindAnchor, o.ObjectMeta)
	}
	svcs, err := listWith(ctx, c, c.kube.CoreV1().Services(ns).List, envSel)
	if err != nil {
		return inv, fmt.Errorf("listing Services: %w", err)
	}
	for _, o := range svcs.Items {
		add(session.KindService, o.ObjectMeta)
	}
	nps, err := listWith(ctx, c, c.kube.NetworkingV1().NetworkPolicies(ns).List, envSel)
	if err != nil {
		return inv, fmt.Errorf("listing NetworkPolicies: %w", err)
	}
	for _, o := range nps.Items {
		add(session.KindNetworkPolicy, o.ObjectMeta)
	}
	pods, err := listWith(ctx, c, c.kube.CoreV1().Pods(ns).List, envSel)
	if err != nil {
		return inv, fmt.Errorf("listing Pods: %w", err)
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if IsVirtLauncher(pod.ObjectMeta) {
			continue
		}
		if o := add(session.KindPod, pod.ObjectMeta); o != nil {
			o.Ready, o.Down = PodState("", pod).Ready, PodDown(pod)
			o.HomeReader = isHomeReader(pod.Labels, c.cfg.Env)
		}
	}
	return inv, nil
}

// IsVirtLauncher reports whether a Pod is KubeVirt's virt-launcher Pod of
// a VMI: controlled by a VirtualMachineInstance, or labelled
// kubevirt.io=virt-launcher. Such a Pod carries the VMI's labkeep labels
// but is never a workspace: it belongs to its VMI, which the reaper
// reclaims through the VM.
func IsVirtLauncher(m metav1.ObjectMeta) bool {
	if m.Labels[kubevirtv1.AppLabel] == "virt-launcher" {
		return true
	}
	ref := metav1.GetControllerOfNoCopy(&m)
	return ref != nil && ref.Kind == "VirtualMachineInstance" && strings.HasPrefix(ref.APIVersion, "kubevirt.io/")
}

// listWith runs one list call under the per-call timeout.
func listWith[L any](ctx context.Context, c *Cluster, list func(context.Context, metav1.ListOptions) (L, error), opts metav1.ListOptions) (L, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	return list(ctx, opts)
}
