package session_test

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"labkeep/localrun/stacktest"
	"labkeep/shared/reap"
	"labkeep/shared/session"
)

// The reaper's view of the namespace, read as the infra ServiceAccount:
// only this environment's labelled objects, but every VM counted.
func TestInventorySeesOnlyItsEnvironmentButCountsEveryVM(t *testing.T) {
	e := newEnv(t, stacktest.Options{})
	ctx := context.Background()
	opened := e.Opened("inv", "k8s-cluster")
	e.WaitRunning("inv", 30*time.Second)
	for name, labels := range map[string]map[string]any{
		"unlabelled": nil,
		"other-env":  {"labkeep.io/env": "prod", "labkeep.io/session": "someone-else"},
	} {
		vm := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
			"metadata": map[string]any{"name": name},
			"spec":     map[string]any{"runStrategy": "Halted", "template": map[string]any{"spec": map[string]any{"domain": map[string]any{"devices": map[string]any{}}}}},
		}}
		if labels != nil {
			vm.SetLabels(map[string]string{"labkeep.io/env": "prod", "labkeep.io/session": "someone-else"})
		}
		if _, err := e.Dyn.Resource(stacktest.Resource("VirtualMachine")).Namespace(e.Namespace).Create(ctx, vm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	inv, err := e.App.Cluster.Inventory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if inv.VMs != 5 {
		t.Errorf("VMs = %d, want 5 (3 of the session, unlabelled, other env)", inv.VMs)
	}
	var got []string
	for _, o := range inv.Objects {
		if o.Env != e.Env || o.Session != opened.ID || o.UID == "" {
			t.Errorf("object %+v is not this environment's session's", o)
		}
		got = append(got, string(o.Kind)+"/"+strings.TrimPrefix(o.Name, "lk-"+opened.ID))
	}
	sort.Strings(got)
	// Secrets are not listed: list returns their data, and the functions may not read Secrets.
	want := "Job/-anchor NetworkPolicy/ Service/ VirtualMachine/-control VirtualMachine/-worker-1 VirtualMachine/-worker-2"
	if strings.Join(got, " ") != want {
		t.Errorf("objects = %v\nwant    %v", got, want)
	}
	if vmi, ok := inv.VMIs[session.NodeName(opened.ID, "worker-2")]; !ok || !vmi.Ready {
		t.Errorf("VMIs = %v", inv.VMIs)
	}
	// Delete with the UID seen: a stale UID (object replaced) is a no-op,
	// the right one deletes.
	var vm reap.Object
	for _, o := range inv.Objects {
		if o.Kind == session.KindVirtualMachine {
			vm = o
		}
	}
	stale := vm.ObjectRef
	stale.UID = "00000000-0000-0000-0000-000000000000"
	if err := e.App.Cluster.Delete(ctx, stale); err != nil {
		t.Errorf("Delete with a stale UID = %v", err)
	}
	if _, err := e.Dyn.Resource(stacktest.Resource("VirtualMachine")).Namespace(e.Namespace).Get(ctx, vm.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("stale-UID delete removed the VM: %v", err)
	}
	if err := e.App.Cluster.Delete(ctx, vm.ObjectRef); err != nil {
		t.Fatal(err)
	}
	if err := e.App.Cluster.Delete(ctx, vm.ObjectRef); err != nil {
		t.Errorf("second Delete of a gone object = %v", err)
	}
}
