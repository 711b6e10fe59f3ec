package controlplane

import (
	"context"
	"fmt"
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

// crdSpec names one KubeVirt resource labkeep uses.
type crdSpec struct {
	group, version, kind, plural, singular string
	short                                  []string
}

// KubeVirtCRDs are the resources labkeep creates or reads: VirtualMachine and
// VirtualMachineInstance (kubevirt.io/v1) and DataVolume
// (cdi.kubevirt.io/v1beta1). Their schemas keep unknown fields: the API
// server stores what the real KubeVirt would accept, and validation of VM
// specs is KubeVirt's webhook's job, which the stand-in does not replace.
var kubeVirtCRDs = []crdSpec{
	{"kubevirt.io", "v1", "VirtualMachine", "virtualmachines", "virtualmachine", []string{"vm", "vms"}},
	{"kubevirt.io", "v1", "VirtualMachineInstance", "virtualmachineinstances", "virtualmachineinstance", []string{"vmi", "vmis"}},
	{"cdi.kubevirt.io", "v1beta1", "DataVolume", "datavolumes", "datavolume", []string{"dv", "dvs"}},
}

// InstallKubeVirtCRDs creates the KubeVirt CRDs (with status subresources)
// and waits until each is Established, so a create right after return works.
// Existing CRDs are left as they are.
func InstallKubeVirtCRDs(ctx context.Context, cfg *rest.Config) error {
	cs, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	preserve := true
	for _, c := range kubeVirtCRDs {
		crd := &apiextensionsv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: c.plural + "." + c.group},
			Spec: apiextensionsv1.CustomResourceDefinitionSpec{
				Group: c.group,
				Names: apiextensionsv1.CustomResourceDefinitionNames{
					Kind: c.kind, ListKind: c.kind + "List", Plural: c.plural, Singular: c.singular,
					ShortNames: c.short, Categories: []string{"all"},
				},
				Scope: apiextensionsv1.NamespaceScoped,
				Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
					Name: c.version, Served: true, Storage: true,
					Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
						Type:                   "object",
						XPreserveUnknownFields: &preserve,
					}},
					Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
					AdditionalPrinterColumns: []apiextensionsv1.CustomResourceColumnDefinition{
						{Name: "Age", Type: "date", JSONPath: ".metadata.creationTimestamp"},
						{Name: "Status", Type: "string", JSONPath: ".status.printableStatus"},
						{Name: "Phase", Type: "string", JSONPath: ".status.phase"},
					},
				}},
			},
		}
		if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create CRD %s: %w", crd.Name, err)
		}
	}
	for _, c := range kubeVirtCRDs {
		name := c.plural + "." + c.group
		for {
			crd, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
			if err == nil && established(crd) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("CRD %s not established: %w", name, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// warmUpCRDs makes one server-side dry-run create of each KubeVirt kind:
// the API server builds a CRD's handler lazily, and the first real create
// would otherwise take about 2 s, in whichever test happens to be first.
func warmUpCRDs(ctx context.Context, cfg *rest.Config) error {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	for _, c := range kubeVirtCRDs {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": c.group + "/" + c.version, "kind": c.kind,
			"metadata": map[string]any{"name": "labkeep-warm-up"},
			"spec":     map[string]any{},
		}}
		gvr := schema.GroupVersionResource{Group: c.group, Version: c.version, Resource: c.plural}
		if _, err := dyn.Resource(gvr).Namespace("default").Create(ctx, u, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			return fmt.Errorf("warm-up create of %s: %w", c.kind, err)
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
