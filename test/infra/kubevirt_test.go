package infra_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"labkeep/infra"
	"labkeep/localrun/stacktest"
	"labkeep/shared/kube"
	"labkeep/shared/labs"
)

// The local control plane serves KubeVirt's own CRDs (localrun/controlplane,
// generated from kubevirt.io/kubevirt), so labkeep's VMs and DataVolumes
// meet KubeVirt's schemas here as on a real cluster.

var (
	virtualMachinesGVR = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachines"}
	dataVolumesGVR     = schema.GroupVersionResource{Group: "cdi.kubevirt.io", Version: "v1beta1", Resource: "datavolumes"}
)

// goldenLabs are the sample labs whose disks are cloned from a golden PVC
// (infra/base/labs.yaml has only containerDisk labs): the only labs with
// DataVolume templates.
const goldenLabs = `labs:
- name: golden-vm
  kind: vm
  nodes: [{role: vm, cpu: "2", memory: 4Gi}]
  disk: {goldenPVC: {name: ubuntu-golden, namespace: labkeep-golden, size: 20Gi}}
- name: golden-cluster
  kind: vm
  nodes: [{role: control, memory: 2Gi}, {role: worker, count: 2}]
  disk: {goldenPVC: {name: ubuntu-golden, namespace: labkeep-golden, size: 20Gi, storageClassName: fast}}
`

// warnings records the API server's warning headers (an unknown field
// dropped under the default field validation is one).
type warnings struct {
	mu   sync.Mutex
	text []string
}

func (w *warnings) HandleWarningHeader(_ int, _, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.text = append(w.text, text)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	t := w.text
	w.text = nil
	return t
}

// watched is the admin config with the server's warnings recorded in w.
func watched(w *warnings) *rest.Config {
	rc := rest.CopyConfig(api.admin)
	rc.WarningHandler = w
	return rc
}

// kubeVirtNamespace creates a namespace for one test and removes it after.
func kubeVirtNamespace(t *testing.T) string {
	t.Helper()
	admin, err := kubernetes.NewForConfig(api.admin)
	if err != nil {
		t.Fatal(err)
	}
	ns := "kv-schema-" + stacktest.Suffix()
	if _, err := admin.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	return ns
}

// Every VirtualMachine labkeep's builder makes, for every VM lab of
// infra/base/labs.yaml and the golden-PVC samples, is created through
// kube.Cluster.Provision without a single unknown-field warning (the
// server's default field validation drops an unknown field with one), and
// each DataVolume its templates stand for, made as KubeVirt's VM
// controller makes it, passes a strict server-side apply.
func TestBuilderObjectsPassKubeVirtSchemas(t *testing.T) {
	ctx := context.Background()
	ns := kubeVirtNamespace(t)
	var warned warnings
	cfg := kube.DefaultConfig()
	cfg.Namespace, cfg.Env, cfg.MaxLifetime = ns, "kv-schema", time.Hour
	cluster, err := kube.NewForConfig(cfg, watched(&warned))
	if err != nil {
		t.Fatal(err)
	}
	data, err := infra.File("labs.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var all []labs.Lab
	for _, doc := range [][]byte{data, []byte(goldenLabs)} {
		cat, err := labs.Parse(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range cat.Names() {
			if l, _ := cat.Get(name); l.Kind == labs.KindVM {
				all = append(all, l)
			}
		}
	}
	var vms, dvs int
	for _, lab := range all {
		t.Run(lab.Name, func(t *testing.T) {
			s := studentSession(lab)
			if err := cluster.Provision(ctx, s, lab); err != nil {
				t.Fatalf("labkeep's own %s session refused: %v", lab.Name, err)
			}
			for _, w := range warned.take() {
				if strings.Contains(w, "unknown field") || strings.Contains(w, "duplicate field") {
					t.Errorf("the server dropped part of a %s object: %s", lab.Name, w)
				} else {
					t.Logf("warning: %s", w)
				}
			}
			list, err := api.dyn.Resource(virtualMachinesGVR).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelSession + "=" + s.ID})
			if err != nil {
				t.Fatal(err)
			}
			if len(list.Items) != len(lab.Nodes) {
				t.Fatalf("%d VirtualMachines for %d nodes", len(list.Items), len(lab.Nodes))
			}
			for _, vm := range list.Items {
				vms++
				templates, _, _ := unstructured.NestedSlice(vm.Object, "spec", "dataVolumeTemplates")
				if lab.Disk.GoldenPVC != nil && len(templates) == 0 {
					t.Errorf("VM %s of a golden-PVC lab has no DataVolume template", vm.GetName())
				}
				for _, tmpl := range templates {
					dv := dataVolumeFromTemplate(t, &vm, tmpl)
					if err := api.apply(ctx, dv, ns, false); err != nil {
						t.Errorf("DataVolume %s of VM %s refused: %v", dv.GetName(), vm.GetName(), err)
					}
					dvs++
				}
			}
		})
	}
	if vms == 0 || dvs == 0 {
		t.Fatalf("validated %d VMs and %d DataVolumes; want some of each", vms, dvs)
	}
	t.Logf("%d labs: %d VirtualMachines and %d DataVolumes passed KubeVirt's schemas", len(all), vms, dvs)
}

// dataVolumeFromTemplate is the DataVolume KubeVirt's VM controller makes
// from one of vm's dataVolumeTemplates: the template's metadata and spec,
// owned by the VM.
func dataVolumeFromTemplate(t *testing.T, vm *unstructured.Unstructured, tmpl any) *unstructured.Unstructured {
	t.Helper()
	m, ok := tmpl.(map[string]any)
	if !ok {
		t.Fatalf("VM %s: a dataVolumeTemplate is a %T", vm.GetName(), tmpl)
	}
	dv := &unstructured.Unstructured{Object: map[string]any{"spec": m["spec"]}}
	meta, _ := m["metadata"].(map[string]any)
	dv.SetAPIVersion("cdi.kubevirt.io/v1beta1")
	dv.SetKind("DataVolume")
	name, _ := meta["name"].(string)
	dv.SetName(name)
	if l, ok := meta["labels"].(map[string]any); ok {
		labels := map[string]string{}
		for k, v := range l {
			labels[k], _ = v.(string)
		}
		dv.SetLabels(labels)
	}
	tr := true
	dv.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: vm.GetName(), UID: vm.GetUID(), Controller: &tr, BlockOwnerDeletion: &tr}})
	return dv
}

// The schemas are KubeVirt's, not "keep unknown fields": a misspelt field
// is refused under strict field validation (kubectl's default) and dropped
// with a warning under the API's default, and a missing required field or
// a wrong type is refused either way. Each object is a valid one changed
// in one way.
func TestKubeVirtSchemasRefuseBrokenObjects(t *testing.T) {
	ctx := context.Background()
	ns := kubeVirtNamespace(t)
	vm := func() map[string]any {
		return map[string]any{
			"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
			"spec": map[string]any{
				"runStrategy": "Always",
				"template": map[string]any{"spec": map[string]any{"domain": map[string]any{
					"devices":   map[string]any{"disks": []any{map[string]any{"name": "root", "disk": map[string]any{"bus": "virtio"}}}},
					"resources": map[string]any{"requests": map[string]any{"memory": "1Gi"}},
				}}},
			},
		}
	}
	dv := func() map[string]any {
		return map[string]any{
			"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
			"spec": map[string]any{
				"source":  map[string]any{"pvc": map[string]any{"namespace": "labkeep-golden", "name": "ubuntu-golden"}},
				"storage": map[string]any{"resources": map[string]any{"requests": map[string]any{"storage": "20Gi"}}},
			},
		}
	}
	domain := []string{"spec", "template", "spec", "domain"}
	set := func(obj map[string]any, value any, path ...string) map[string]any {
		if err := unstructured.SetNestedField(obj, value, path...); err != nil {
			t.Fatal(err)
		}
		return obj
	}
	remove := func(obj map[string]any, path ...string) map[string]any {
		unstructured.RemoveNestedField(obj, path...)
		return obj
	}
	disks := func(obj map[string]any, disk map[string]any) map[string]any {
		return set(obj, []any{disk}, append(domain, "devices", "disks")...)
	}
	for _, tc := range []struct {
		name   string
		gvr    schema.GroupVersionResource
		obj    map[string]any
		strict bool
		// wantErr is a fragment of the refusal; "" means created, with
		// dropped (a field gone when read back) and a warning naming it.
		wantErr string
		dropped []string
	}{
		{name: "valid VM is created", gvr: virtualMachinesGVR, obj: vm(), strict: true},
		{name: "valid DataVolume is created", gvr: dataVolumesGVR, obj: dv(), strict: true},
		{
			name: "misspelt VM field is refused under strict validation", gvr: virtualMachinesGVR, strict: true,
			obj:     disks(vm(), map[string]any{"name": "root", "disk": map[string]any{"buss": "virtio"}}),
			wantErr: `unknown field "spec.template.spec.domain.devices.disks[0].disk.buss"`,
		},
		{
			name: "misspelt VM field is dropped with a warning under the default validation", gvr: virtualMachinesGVR,
			obj:     set(vm(), "4Gi", append(domain, "memroy")...),
			dropped: append(domain, "memroy"),
		},
		{
			name: "VM without domain.devices is refused", gvr: virtualMachinesGVR, strict: true,
			obj:     remove(vm(), append(domain, "devices")...),
			wantErr: "spec.template.spec.domain.devices: Required value",
		},
		{
			name: "VM without a template is refused", gvr: virtualMachinesGVR,
			obj:     remove(vm(), "spec", "template"),
			wantErr: "spec.template: Required value",
		},
		{
			name: "VM runStrategy of the wrong type is refused", gvr: virtualMachinesGVR,
			obj:     set(vm(), int64(1), "spec", "runStrategy"),
			wantErr: "spec.runStrategy: Invalid value",
		},
		{
			name: "misspelt DataVolume field is refused under strict validation", gvr: dataVolumesGVR, strict: true,
			obj:     set(dv(), "ubuntu-golden", "spec", "source", "pvc", "nmae"),
			wantErr: `unknown field "spec.source.pvc.nmae"`,
		},
		{
			name: "misspelt DataVolume field is dropped with a warning under the default validation", gvr: dataVolumesGVR,
			obj:     set(dv(), "fast", "spec", "storage", "storageClass"),
			dropped: []string{"spec", "storage", "storageClass"},
		},
		{
			name: "DataVolume without a spec is refused", gvr: dataVolumesGVR,
			obj:     remove(dv(), "spec"),
			wantErr: "spec: Required value",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var warned warnings
			dyn, err := dynamic.NewForConfig(watched(&warned))
			if err != nil {
				t.Fatal(err)
			}
			u := &unstructured.Unstructured{Object: tc.obj}
			u.SetName("kv-" + stacktest.Suffix())
			opts := metav1.CreateOptions{}
			if tc.strict {
				opts.FieldValidation = metav1.FieldValidationStrict
			}
			created, err := dyn.Resource(tc.gvr).Namespace(ns).Create(ctx, u, opts)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("create: got %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("create refused: %v", err)
			}
			got := warned.take()
			if tc.dropped == nil {
				if len(got) != 0 {
					t.Errorf("warnings for a valid object: %q", got)
				}
				return
			}
			if _, found, _ := unstructured.NestedFieldNoCopy(created.Object, tc.dropped...); found {
				t.Errorf("%s was kept; want it dropped", strings.Join(tc.dropped, "."))
			}
			want := `unknown field "` + strings.Join(tc.dropped, ".") + `"`
			if !containsFragment(got, want) {
				t.Errorf("warnings %q; want one containing %q", got, want)
			}
		})
	}
}

func containsFragment(texts []string, fragment string) bool {
	for _, s := range texts {
		if strings.Contains(s, fragment) {
			return true
		}
	}
	return false
}
