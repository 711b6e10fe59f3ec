package controlplane

import (
	"context"
	"fmt"
	"os"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// InstallKubeVirtCRDs creates the CRDs of the file EnsureKubeVirtCRDs made
// (VirtualMachine, VirtualMachineInstance, DataVolume with KubeVirt's
// schemas and status subresources) and waits until each is Established,
// so a create right after return works. Existing CRDs are left as they
// are.
func InstallKubeVirtCRDs(ctx context.Context, cfg *rest.Config, crdFile string) error {
	data, err := os.ReadFile(crdFile)
	if err != nil {
		return err
	}
	crds, err := decodeCRDs(data)
	if err != nil {
		return fmt.Errorf("%s: %w", crdFile, err)
	}
	cs, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	for _, crd := range crds {
		if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create CRD %s: %w", crd.Name, err)
		}
	}
	for _, c := range crds {
		for {
			crd, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, c.Name, metav1.GetOptions{})
			if err == nil && established(crd) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("CRD %s not established: %w", c.Name, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// warmUpObjects are the smallest objects of each KubeVirt kind the schemas
// accept, for warmUpCRDs.
var warmUpObjects = []struct {
	gvr  schema.GroupVersionResource
	kind string
	spec map[string]any
}{
	{
		schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachines"}, "VirtualMachine",
		map[string]any{"template": map[string]any{"spec": map[string]any{"domain": map[string]any{"devices": map[string]any{}}}}},
	},
	{
		schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}, "VirtualMachineInstance",
		map[string]any{"domain": map[string]any{"devices": map[string]any{}}},
	},
	{
		schema.GroupVersionResource{Group: "cdi.kubevirt.io", Version: "v1beta1", Resource: "datavolumes"}, "DataVolume",
		map[string]any{"source": map[string]any{"blank": map[string]any{}}},
	},
}

// warmUpCRDs makes one server-side dry-run create of each KubeVirt kind:
// the API server builds a CRD's handler lazily, and the first real create
// would otherwise take about 2 s, in whichever test happens to be first.
func warmUpCRDs(ctx context.Context, cfg *rest.Config) error {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	for _, w := range warmUpObjects {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": w.gvr.GroupVersion().String(), "kind": w.kind,
			"metadata": map[string]any{"name": "labkeep-warm-up"},
			"spec":     w.spec,
		}}
		if _, err := dyn.Resource(w.gvr).Namespace("default").Create(ctx, u, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			return fmt.Errorf("warm-up create of %s: %w", w.kind, err)
		}
	}
	return nil
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}
