package kubevirt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// Namespace is where KubeVirt's components run, as virt-operator's
// default installation puts them.
const Namespace = "kubevirt"

// Registry is where production pulls KubeVirt's images from; the local
// images carry the same names (see package images).
const Registry = "quay.io/kubevirt"

// SchedulableLabel is the label virt-handler sets on a node once it can
// run VMs; virt-launcher Pods select it.
const SchedulableLabel = "kubevirt.io/schedulable"

// Install installs KubeVirt on the cluster at cfg without virt-operator:
// it applies, in order, the objects virt-operator would create (printed by
// b.Install from virt-operator's own install strategy, with fresh
// certificates), marks the KubeVirt object deployed as virt-operator does
// once its components are up (virt-api, virt-controller and virt-handler
// read their configuration only from a KubeVirt object that has a phase),
// and returns once virt-api and virt-controller are available and
// virt-handler has marked node schedulable. Guests run under software
// emulation when emulation is set (no /dev/kvm).
//
// Why not virt-operator: it would add an image, a dump Job and minutes of
// reconciling to every start of a local stack, for a result that is the
// same objects; what labkeep talks to (virt-api's webhooks and
// subresources, virt-controller, virt-handler, virt-launcher) is KubeVirt's
// own in both cases.
func Install(ctx context.Context, cfg *rest.Config, b Binaries, node string, emulation bool, progress io.Writer) error {
	if progress == nil {
		progress = io.Discard
	}
	start := time.Now()
	args := []string{"-namespace", Namespace, "-version", b.Version, "-registry", Registry, "-replicas", "1"}
	if emulation {
		args = append(args, "-use-emulation")
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, b.Install, args...)
	cmd.Stderr = &stderr
	manifest, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", b.Install, err, strings.TrimSpace(stderr.String()))
	}
	objs, err := decode(manifest)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))
	// CDI does not run here (its module is not on the Go module proxy),
	// and virt-controller takes any cdi.kubevirt.io CRD for an installed
	// CDI and then waits for CDI's other APIs before it handles a VM: the
	// DataVolume CRD the local control plane starts with (for virtsim)
	// goes before virt-controller starts.
	crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	if err := dyn.Resource(crds).Delete(ctx, "datavolumes.cdi.kubevirt.io", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete the DataVolume CRD: %w", err)
	}
	for _, o := range objs {
		if err := create(ctx, dyn, mapper, o); err != nil {
			return err
		}
	}
	kv := schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "kubevirts"}
	status := []byte(`{"status":{"phase":"Deployed","defaultArchitecture":"amd64"}}`)
	if _, err := dyn.Resource(kv).Namespace(Namespace).Patch(ctx, "kubevirt", types.MergePatchType, status, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("mark KubeVirt deployed: %w", err)
	}
	fmt.Fprintf(progress, "labkeep: applied KubeVirt %s's %d objects in %s; waiting for its components\n", b.Version, len(objs), time.Since(start).Round(10*time.Millisecond))
	if err := waitReady(ctx, cs, node); err != nil {
		return err
	}
	fmt.Fprintf(progress, "labkeep: KubeVirt %s ready in %s\n", b.Version, time.Since(start).Round(10*time.Millisecond))
	return nil
}

// decode reads every object of a YAML stream.
func decode(manifest []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	var out []*unstructured.Unstructured
	for {
		o := &unstructured.Unstructured{}
		if err := dec.Decode(&o.Object); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, err
		}
		if len(o.Object) > 0 {
			out = append(out, o)
		}
	}
}

// create creates o, mapping its kind to a resource by discovery; a kind
// that a CRD created a moment ago defines is retried until the API server
// serves it. An object that exists already is left as it is.
func create(ctx context.Context, dyn dynamic.Interface, mapper *restmapper.DeferredDiscoveryRESTMapper, o *unstructured.Unstructured) error {
	gvk := o.GroupVersionKind()
	for {
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err == nil {
			var r dynamic.ResourceInterface = dyn.Resource(m.Resource)
			if m.Scope.Name() == meta.RESTScopeNameNamespace {
				r = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
			}
			_, err = r.Create(ctx, o, metav1.CreateOptions{FieldManager: "labkeep"})
			if apierrors.IsAlreadyExists(err) && gvk.Kind == "CustomResourceDefinition" {
				err = replace(ctx, r, o)
			}
			if err == nil || apierrors.IsAlreadyExists(err) {
				return nil
			}
			if !apierrors.IsNotFound(err) {
				return fmt.Errorf("create %s %s/%s: %w", gvk.Kind, o.GetNamespace(), o.GetName(), err)
			}
		} else if !meta.IsNoMatchError(err) {
			return err
		}
		mapper.Reset()
		select {
		case <-ctx.Done():
			return fmt.Errorf("create %s %s: %w (last: %v)", gvk.Kind, o.GetName(), ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// replace replaces the existing object of o's name with o. The local
// control plane starts with KubeVirt's VirtualMachine and
// VirtualMachineInstance CRDs in the variant the stand-in virtsim needs (a
// status subresource); real KubeVirt needs its own, whose VMI status
// virt-handler writes with a plain update.
func replace(ctx context.Context, r dynamic.ResourceInterface, o *unstructured.Unstructured) error {
	cur, err := r.Get(ctx, o.GetName(), metav1.GetOptions{})
	if err != nil {
		return err
	}
	o = o.DeepCopy()
	o.SetResourceVersion(cur.GetResourceVersion())
	_, err = r.Update(ctx, o, metav1.UpdateOptions{FieldManager: "labkeep"})
	return err
}

// waitReady waits for virt-api's and virt-controller's Deployments to be
// available, virt-handler's DaemonSet to be ready and node to carry
// SchedulableLabel=true.
func waitReady(ctx context.Context, cs kubernetes.Interface, node string) error {
	var last string
	for {
		last = readiness(ctx, cs, node)
		if last == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("KubeVirt not ready: %w: %s\n%s", ctx.Err(), last, podsReport(cs))
		case <-time.After(time.Second):
		}
	}
}

// podsReport describes KubeVirt's Pods and the namespace's warnings, for
// an error that says why KubeVirt did not come up.
func podsReport(cs kubernetes.Interface) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b strings.Builder
	pods, err := cs.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s: %s", p.Name, p.Status.Phase)
		for _, c := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			fmt.Fprintf(&b, "; %s ready=%v restarts=%d", c.Name, c.Ready, c.RestartCount)
			if w := c.State.Waiting; w != nil {
				fmt.Fprintf(&b, " waiting %s: %s", w.Reason, w.Message)
			}
			if t := c.LastTerminationState.Terminated; t != nil {
				fmt.Fprintf(&b, " last exit %d %s: %s", t.ExitCode, t.Reason, t.Message)
			}
		}
		b.WriteString("\n")
	}
	events, err := cs.CoreV1().Events(Namespace).List(ctx, metav1.ListOptions{FieldSelector: "type=Warning"})
	if err == nil {
		for _, e := range events.Items {
			fmt.Fprintf(&b, "event %s %s: %s\n", e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
	return b.String()
}

// readiness says what is not ready yet ("" when everything is).
func readiness(ctx context.Context, cs kubernetes.Interface, node string) string {
	for _, name := range []string{"virt-api", "virt-controller"} {
		d, err := cs.AppsV1().Deployments(Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if d.Status.AvailableReplicas < 1 {
			return name + " not available"
		}
	}
	ds, err := cs.AppsV1().DaemonSets(Namespace).Get(ctx, "virt-handler", metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	if ds.Status.NumberReady < 1 {
		return "virt-handler not ready"
	}
	n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	if n.Labels[SchedulableLabel] != "true" {
		return "node " + node + " not yet schedulable for VMs"
	}
	return ""
}
