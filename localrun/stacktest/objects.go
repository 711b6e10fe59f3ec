package stacktest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"labkeep/infra"
	"labkeep/shared/kube"
)

// resources are the kinds labkeep creates in a sessions namespace, or
// causes to be created there (VMIs by virt-controller, DataVolumes by a
// VM's dataVolumeTemplates, the anchor Job's and virt-launcher Pods).
var resources = map[string]schema.GroupVersionResource{
	"DataVolume":             {Group: "cdi.kubevirt.io", Version: "v1beta1", Resource: "datavolumes"},
	"Job":                    {Group: "batch", Version: "v1", Resource: "jobs"},
	"NetworkPolicy":          {Group: "networking.k8s.io", Version: "v1", Resource: "networkpolicies"},
	"Pod":                    {Version: "v1", Resource: "pods"},
	"Secret":                 {Version: "v1", Resource: "secrets"},
	"Service":                {Version: "v1", Resource: "services"},
	"VirtualMachine":         {Group: "kubevirt.io", Version: "v1", Resource: "virtualmachines"},
	"VirtualMachineInstance": {Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"},
}

// Resource is the API resource of kind, one of the kinds Objects lists.
// An unknown kind is a bug in the test and panics.
func Resource(kind string) schema.GroupVersionResource {
	gvr, ok := resources[kind]
	if !ok {
		panic(fmt.Sprintf("stacktest: no resource for kind %q", kind))
	}
	return gvr
}

// Object is one object found in a sessions namespace.
type Object struct {
	Kind, Name string
	// Session is its labkeep.io/session label ("" if none).
	Session string
	// Deleting: it has a deletion timestamp but is still there ("gone"
	// means absent, not merely deleting).
	Deleting bool
}

// String is "Kind/name", with " (deleting)" for an object being deleted.
func (o Object) String() string {
	s := o.Kind + "/" + o.Name
	if o.Deleting {
		s += " (deleting)"
	}
	return s
}

// Listing says which objects ListObjects returns.
type Listing struct {
	// Selector is a label selector ("" = every object).
	Selector string
	// Kinds to list (nil = every kind labkeep creates or causes).
	Kinds []string
	// LeaveOutAnchorPods leaves out the anchor Jobs' Pods (label
	// kube.LabelAnchorOf): the Job controller creates and replaces them
	// whenever it gets to it, so they are not objects labkeep made.
	LeaveOutAnchorPods bool
}

// ListObjects lists the objects of l in namespace ns with the admin
// client dyn, sorted by String.
func ListObjects(t testing.TB, dyn dynamic.Interface, ns string, l Listing) []Object {
	t.Helper()
	kinds := l.Kinds
	if kinds == nil {
		for kind := range resources {
			kinds = append(kinds, kind)
		}
	}
	var out []Object
	for _, kind := range kinds {
		list, err := dyn.Resource(Resource(kind)).Namespace(ns).List(context.Background(), metav1.ListOptions{LabelSelector: l.Selector})
		if apierrors.IsNotFound(err) && kind == "DataVolume" {
			// A cluster without CDI (real KubeVirt on the local node)
			// serves no DataVolumes: none can exist.
			continue
		}
		if err != nil {
			t.Fatalf("list %s in %s: %v", kind, ns, err)
		}
		for _, o := range list.Items {
			if _, anchorPod := o.GetLabels()[kube.LabelAnchorOf]; anchorPod && l.LeaveOutAnchorPods {
				continue
			}
			if kind == "NetworkPolicy" && o.GetName() == infra.SessionsDefaultDeny {
				continue // the namespace's own, installed with it
			}
			out = append(out, Object{Kind: kind, Name: o.GetName(), Session: o.GetLabels()[kube.LabelSession], Deleting: o.GetDeletionTimestamp() != nil})
		}
	}
	slices.SortFunc(out, func(a, b Object) int {
		if a.String() < b.String() {
			return -1
		}
		if a.String() > b.String() {
			return 1
		}
		return 0
	})
	return out
}

// Names are the objects' Strings, in order.
func Names(objs []Object) []string {
	out := make([]string, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.String())
	}
	return out
}

// List lists the objects of l in the deployment's sessions namespace.
func (d *Deployment) List(l Listing) []Object {
	d.t.Helper()
	return ListObjects(d.t, d.Dyn, d.Namespace, l)
}

// Objects names every object of every kind in the sessions namespace
// matching selector ("" = all), anchor Pods included, sorted.
func (d *Deployment) Objects(selector string) []string {
	d.t.Helper()
	return Names(d.List(Listing{Selector: selector}))
}

// SessionObjects names the objects labelled with session id (VMIs and
// virt-launcher Pods carry the VM template's labels too), leaving out the
// anchor's Pods, sorted.
func (d *Deployment) SessionObjects(id string) []string {
	d.t.Helper()
	return Names(d.List(Listing{Selector: kube.LabelSession + "=" + id, LeaveOutAnchorPods: true}))
}

// GoneWithin bounds how long WaitNoObjects and WaitGone wait for the
// cluster to delete what sessions owned. Deleting is asynchronous:
// labkeep deletes its objects, the garbage collector the VMIs and Pods
// they own, and the kubelet stops each Pod's containers and tears down its
// sandbox before the Pod goes. It bounds a hang, never a speed: beside
// other suites on a 2-core machine the kubelet has taken over 30 s to
// finish eight Pods, so every wait for deletion uses this one generous
// bound, and a wait longer than slowGone is logged so slowness shows.
const GoneWithin = 3 * time.Minute

// slowGone is how long a wait for deletion may take before it is logged.
const slowGone = 20 * time.Second

// WaitNoObjects waits until the sessions namespace holds nothing of the
// kinds labkeep creates or causes (VMIs, DataVolumes and anchor Pods
// included).
func (d *Deployment) WaitNoObjects() {
	d.t.Helper()
	d.waitGone(func() []string { return d.Objects("") }, "objects left")
}

// WaitNoneMatching waits until no object matching selector is left in the
// sessions namespace, anchor Pods included.
func (d *Deployment) WaitNoneMatching(selector string) {
	d.t.Helper()
	d.waitGone(func() []string { return d.Objects(selector) }, "objects matching "+selector+" left")
}

// WaitGone waits until no object of session id is left.
func (d *Deployment) WaitGone(id string) {
	d.t.Helper()
	d.waitGone(func() []string { return d.SessionObjects(id) }, "objects of session "+id+" left")
}

// waitGone waits until left returns nothing, within GoneWithin.
func (d *Deployment) waitGone(left func() []string, what string) {
	d.t.Helper()
	start := time.Now()
	var first []string
	Eventually(d.t, GoneWithin, func() (bool, string) {
		l := left()
		if first == nil {
			first = l
		}
		return len(l) == 0, fmt.Sprintf("%s: %v", what, l)
	})
	if took := time.Since(start); took > slowGone {
		d.t.Logf("deleting took %s (at the start, %s: %v)", took.Round(time.Second), what, first)
	}
}
