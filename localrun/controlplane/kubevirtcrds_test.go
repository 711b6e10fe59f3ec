package controlplane

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The CRDs are generated from the KubeVirt release and CDI API labkeep is
// compiled against, so the schemas the tests meet are those of the types
// the code builds.
func TestKubeVirtVersionsAreGoMods(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	required := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 {
			required[f[0]] = f[1]
		}
	}
	want := map[string]string{
		"kubevirt.io/api": DefaultVersions.KubeVirt,
		"kubevirt.io/containerized-data-importer-api": DefaultVersions.CDIAPI,
	}
	got := map[string]string{}
	for m := range want {
		got[m] = required[m]
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("DefaultVersions (-want) and go.mod (+got) disagree:\n%s", diff)
	}
}

// Generated CRDs are reused; a half-written ".partial" from an interrupted
// run is not. No go command can succeed here (the context is cancelled),
// so a case that needs no generation must succeed without one.
func TestEnsureKubeVirtCRDsReusesOnlyAFinishedFile(t *testing.T) {
	v := Versions{KubeVirt: "v1.7.99", CDIAPI: "v1.63.99"}
	for _, tc := range []struct {
		name      string
		file      string // written before the call
		generates bool
	}{
		{name: "generated before", file: kubeVirtCRDsFile},
		{name: "only a partial file", file: kubeVirtCRDsFile + ".partial", generates: true},
		{name: "nothing yet", generates: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cache := t.TempDir()
			dir := filepath.Join(cache, "kubevirt-v1.7.99_cdi-api-v1.63.99")
			if tc.file != "" {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, tc.file), []byte("---\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			var progress bytes.Buffer
			path, err := EnsureKubeVirtCRDs(ctx, cache, v, &progress)
			if !tc.generates {
				if err != nil || path != filepath.Join(dir, kubeVirtCRDsFile) || progress.Len() != 0 {
					t.Fatalf("cached CRDs not reused: path %q, err %v, progress %q", path, err, progress.String())
				}
				return
			}
			if err == nil {
				t.Fatal("EnsureKubeVirtCRDs succeeded without generating")
			}
			if want := "labkeep: generating the KubeVirt v1.7.99 CRDs"; !strings.HasPrefix(progress.String(), want) {
				t.Fatalf("progress %q, want it to start with %q", progress.String(), want)
			}
		})
	}
}

func TestEnsureKubeVirtCRDsNeedsBothVersions(t *testing.T) {
	for _, v := range []Versions{{KubeVirt: "v1.7.0"}, {CDIAPI: "v1.63.1"}} {
		cache := t.TempDir()
		if _, err := EnsureKubeVirtCRDs(context.Background(), cache, v, nil); err == nil {
			t.Errorf("%+v accepted", v)
		}
		if entries, _ := os.ReadDir(cache); len(entries) != 0 {
			t.Errorf("%+v: the cache got %d entries", v, len(entries))
		}
	}
}

// Only replaces naming a published module version are taken over: the
// wrapper module has no staging directories.
func TestPublishedReplaces(t *testing.T) {
	gomod := `module kubevirt.io/kubevirt

require k8s.io/api v0.33.5

replace github.com/nxadm/tail => github.com/nxadm/tail v0.0.0-20211216163028-4472660a31a6

replace (
	github.com/openshift/api => github.com/openshift/api v0.0.0-20210105115604-44119421ec6b

	k8s.io/api => k8s.io/api v0.33.5
	kubevirt.io/api => ./staging/src/kubevirt.io/api
	example.org/abs => /abs/path
)
`
	want := []string{
		"github.com/nxadm/tail => github.com/nxadm/tail v0.0.0-20211216163028-4472660a31a6",
		"github.com/openshift/api => github.com/openshift/api v0.0.0-20210105115604-44119421ec6b",
		"k8s.io/api => k8s.io/api v0.33.5",
	}
	if diff := cmp.Diff(want, publishedReplaces(gomod)); diff != "" {
		t.Fatalf("replaces (-want +got):\n%s", diff)
	}
}

func TestRequiredVersion(t *testing.T) {
	gomod := `module kubevirt.io/kubevirt

replace k8s.io/api => k8s.io/api v0.33.9

require k8s.io/api v0.33.5

require (
	kubevirt.io/containerized-data-importer-api v1.63.1
	kubevirt.io/api v0.0.0 // indirect
)

replace kubevirt.io/api => ./staging/src/kubevirt.io/api
`
	for module, want := range map[string]string{
		"k8s.io/api": "v0.33.5",
		"kubevirt.io/containerized-data-importer-api": "v1.63.1",
		"kubevirt.io/api":     "v0.0.0",
		"kubevirt.io/missing": "",
	} {
		if got := requiredVersion(gomod, module); got != want {
			t.Errorf("requiredVersion(%s) = %q, want %q", module, got, want)
		}
	}
}

// KubeVirt's CRDs are kept as generated but for a status subresource on
// every version, and the DataVolume CRD's spec schema is the VM CRD's
// schema of a DataVolume template's spec.
func TestLocalKubeVirtCRDs(t *testing.T) {
	dvSpec := apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
		"source": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{"blank": {Type: "object"}}},
	}}
	vmSchema := &apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
		"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"dataVolumeTemplates": {Type: "array", Items: &apiextensionsv1.JSONSchemaPropsOrArray{Schema: &apiextensionsv1.JSONSchemaProps{
				Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{"spec": dvSpec},
			}}},
		}},
	}}
	crd := func(name string, versions ...apiextensionsv1.CustomResourceDefinitionVersion) *apiextensionsv1.CustomResourceDefinition {
		return &apiextensionsv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       apiextensionsv1.CustomResourceDefinitionSpec{Versions: versions},
			Status:     apiextensionsv1.CustomResourceDefinitionStatus{StoredVersions: []string{"v1"}},
		}
	}
	withSchema := func(name string, storage bool) apiextensionsv1.CustomResourceDefinitionVersion {
		return apiextensionsv1.CustomResourceDefinitionVersion{Name: name, Served: true, Storage: storage,
			Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: vmSchema.DeepCopy()}}
	}
	vm := crd("virtualmachines.kubevirt.io", withSchema("v1", true), withSchema("v1alpha3", false))
	vmi := crd("virtualmachineinstances.kubevirt.io", apiextensionsv1.CustomResourceDefinitionVersion{Name: "v1", Served: true, Storage: true})

	got, err := localKubeVirtCRDs([]*apiextensionsv1.CustomResourceDefinition{vmi, vm})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range got {
		names = append(names, c.Name)
		if c.Status.StoredVersions != nil {
			t.Errorf("%s keeps a status", c.Name)
		}
		for _, v := range c.Spec.Versions {
			if v.Subresources == nil || v.Subresources.Status == nil {
				t.Errorf("%s %s has no status subresource", c.Name, v.Name)
			}
		}
	}
	if diff := cmp.Diff([]string{"virtualmachines.kubevirt.io", "virtualmachineinstances.kubevirt.io", "datavolumes.cdi.kubevirt.io"}, names); diff != "" {
		t.Fatalf("CRDs (-want +got):\n%s", diff)
	}
	dv := got[2].Spec.Versions[0]
	if diff := cmp.Diff(dvSpec, dv.Schema.OpenAPIV3Schema.Properties["spec"]); diff != "" {
		t.Errorf("DataVolume spec schema (-want +got):\n%s", diff)
	}

	if _, err := localKubeVirtCRDs([]*apiextensionsv1.CustomResourceDefinition{vm}); err == nil {
		t.Error("no VirtualMachineInstance CRD accepted")
	}
	noTemplates := crd("virtualmachines.kubevirt.io", apiextensionsv1.CustomResourceDefinitionVersion{Name: "v1", Served: true, Storage: true,
		Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object"}}})
	if _, err := localKubeVirtCRDs([]*apiextensionsv1.CustomResourceDefinition{noTemplates, vmi}); err == nil {
		t.Error("a VirtualMachine CRD without DataVolume templates accepted")
	}
}
