// Package infra_test checks labkeep's deployment manifests (infra/) against
// a real kube-apiserver that serves the real third-party CRDs (Knative
// Serving and Eventing, fetched as pinned, checksummed modules through the
// Go module proxy: crdsources_test.go; KubeVirt's, which the control plane
// installs): every object must pass a server-side dry-run apply with
// strict field validation, so a misspelt field, a wrong apiVersion or an
// invalid value fails here instead of at `kubectl apply` time in
// production.
package infra_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"labkeep/localrun/controlplane"
	"labkeep/localrun/stacktest"
)

// fieldManager owns everything this package applies.
const fieldManager = "labkeep-infra-test"

// Package state, set up once by TestMain.
var (
	repoRoot string   // the directory holding go.mod
	crdFiles []string // the third-party CRD files installed
	api      *cluster
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if repoRoot, err = findRepoRoot(); err != nil {
		fmt.Fprintln(os.Stderr, "test/infra:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, controlplane.Options{Progress: os.Stderr, StopOnSignal: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "test/infra: control plane:", err)
		return 1
	}
	defer cp.Stop()
	for kind, reason := range notFetched {
		fmt.Fprintf(os.Stderr, "test/infra: SKIPPED %s: %s\n", kind, reason)
	}
	if api, err = setUpCluster(ctx, cp); err != nil {
		fmt.Fprintln(os.Stderr, "test/infra:", err)
		return 1
	}
	if err := keepConfigMapParamsWatched(ctx, api); err != nil {
		fmt.Fprintln(os.Stderr, "test/infra:", err)
		return 1
	}
	return m.Run()
}

// keepConfigMapParamsWatched creates a policy taking ConfigMap params that
// lives as long as the API server and matches nothing. The API server's
// admission plugin starts the shared ConfigMap informer for the first
// policy with ConfigMap params and stops it when the last such policy is
// deleted; a shared informer once stopped is never started again
// (k8s.io/apiserver's policySource), so a later policy's binding finds no
// params for good and, with parameterNotFoundAction Deny, refuses every
// request it matches. Tests each install and delete labkeep's policy: this
// one keeps the informer running between them. (In a real cluster the same
// happens if labkeep's policy is deleted while no other policy takes
// ConfigMap params; infra/README.md says so.)
func keepConfigMapParamsWatched(ctx context.Context, c *cluster) error {
	admin, err := kubernetes.NewForConfig(c.admin)
	if err != nil {
		return err
	}
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "test-infra-keeps-configmap-params"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			ParamKind: &admissionregistrationv1.ParamKind{APIVersion: "v1", Kind: "ConfigMap"},
			MatchConstraints: &admissionregistrationv1.MatchResources{
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
				}}},
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"test-infra/never": "matched"}},
			},
			Validations: []admissionregistrationv1.Validation{{Expression: "true"}},
		},
	}
	if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		return err
	}
	allow := admissionregistrationv1.AllowAction
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        policy.Name,
			ParamRef:          &admissionregistrationv1.ParamRef{Name: "none", Namespace: "default", ParameterNotFoundAction: &allow},
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources:    &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"test-infra/never": "matched"}}},
		},
	}
	_, err = admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{})
	return err
}

// findRepoRoot walks up from the working directory to the directory
// holding go.mod (tests run in their package's directory).
func findRepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// cluster is the control plane as these tests use it.
type cluster struct {
	admin  *rest.Config // system:masters; impersonates ServiceAccounts
	dyn    dynamic.Interface
	mapper meta.RESTMapper
	groups map[string]bool // API groups the server serves
}

// setUpCluster installs the third-party CRDs (fetchCRDs), waits until they
// are Established and discoverable, and creates the namespaces the
// manifests live in (for real: a dry-run object needs an existing
// namespace).
func setUpCluster(ctx context.Context, cp *controlplane.ControlPlane) (*cluster, error) {
	dyn, err := dynamic.NewForConfig(cp.Admin)
	if err != nil {
		return nil, err
	}
	c := &cluster{admin: cp.Admin, dyn: dyn}
	files, err := fetchCRDs(ctx)
	if err != nil {
		return nil, fmt.Errorf("third-party CRDs: %w", err)
	}
	crds, err := installCRDs(ctx, dyn, files)
	if err != nil {
		return nil, err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cp.Admin)
	if err != nil {
		return nil, err
	}
	if err := c.discover(ctx, dc, crds); err != nil {
		return nil, err
	}
	// The namespaces of namespaces.yaml, plus the golden-PVC namespace the
	// operator creates (golden-clone-rbac.yaml).
	nsObjs, err := decodeFile(filepath.Join(repoRoot, "infra", "base", "namespaces.yaml"))
	if err != nil {
		return nil, err
	}
	golden := &unstructured.Unstructured{}
	golden.SetAPIVersion("v1")
	golden.SetKind("Namespace")
	golden.SetName("labkeep-golden")
	// And one enforcing the restricted Pod Security level.
	restricted := &unstructured.Unstructured{}
	restricted.SetAPIVersion("v1")
	restricted.SetKind("Namespace")
	restricted.SetName(restrictedNamespace)
	restricted.SetLabels(map[string]string{"pod-security.kubernetes.io/enforce": "restricted"})
	for _, ns := range append(nsObjs, golden, restricted) {
		if ns.GetKind() != "Namespace" {
			continue // the sessions namespace's default-deny: no traffic is tried here
		}
		if err := c.apply(ctx, ns, "", false); err != nil {
			return nil, fmt.Errorf("creating namespace %s: %w", ns.GetName(), err)
		}
	}
	// Pods are admitted only once their namespace's default ServiceAccount
	// exists (the serviceaccount controller creates it).
	saRes := schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}
	err = stacktest.Until(ctx, func() (bool, string) {
		_, err := dyn.Resource(saRes).Namespace(restrictedNamespace).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, fmt.Sprintf("no default ServiceAccount in %s: %v", restrictedNamespace, err)
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// restrictedNamespace enforces Pod Security "restricted"; Pods made from
// the manifests' templates are tried there.
const restrictedNamespace = "labkeep-psa-restricted"

// installCRDs applies every CustomResourceDefinition of the YAML files
// and waits until each is Established. It returns the kinds they define.
func installCRDs(ctx context.Context, dyn dynamic.Interface, files []string) ([]schema.GroupVersionKind, error) {
	crdRes := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	var names []string
	var kinds []schema.GroupVersionKind
	for _, path := range files {
		objs, err := decodeFile(path)
		if err != nil {
			return nil, err
		}
		for _, o := range objs {
			if o.GetKind() != "CustomResourceDefinition" {
				continue
			}
			body, err := json.Marshal(o.Object)
			if err != nil {
				return nil, err
			}
			force := true
			if _, err := dyn.Resource(crdRes).Patch(ctx, o.GetName(), types.ApplyPatchType, body,
				metav1.PatchOptions{FieldManager: fieldManager, Force: &force}); err != nil {
				return nil, fmt.Errorf("installing CRD %s from %s: %w", o.GetName(), path, err)
			}
			names = append(names, o.GetName())
			group, _, _ := unstructured.NestedString(o.Object, "spec", "group")
			kind, _, _ := unstructured.NestedString(o.Object, "spec", "names", "kind")
			versions, _, _ := unstructured.NestedSlice(o.Object, "spec", "versions")
			for _, v := range versions {
				vm, _ := v.(map[string]any)
				if served, _ := vm["served"].(bool); served {
					kinds = append(kinds, schema.GroupVersionKind{Group: group, Version: fmt.Sprint(vm["name"]), Kind: kind})
				}
			}
			crdFiles = append(crdFiles, path)
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("no CustomResourceDefinition in %v", files)
	}
	for _, name := range names {
		err := stacktest.Until(ctx, func() (bool, string) {
			crd, err := dyn.Resource(crdRes).Get(ctx, name, metav1.GetOptions{})
			return err == nil && established(crd), fmt.Sprintf("CRD %s not Established (last error: %v)", name, err)
		})
		if err != nil {
			return nil, err
		}
	}
	return kinds, nil
}

func established(crd *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conds {
		cm, _ := c.(map[string]any)
		if cm["type"] == "Established" && cm["status"] == "True" {
			return true
		}
	}
	return false
}

// discover builds the REST mapper once every kind in want is served
// (discovery lags a little behind Established).
func (c *cluster) discover(ctx context.Context, dc discovery.DiscoveryInterface, want []schema.GroupVersionKind) error {
	return stacktest.Until(ctx, func() (bool, string) {
		resources, err := restmapper.GetAPIGroupResources(dc)
		if err != nil {
			return false, fmt.Sprintf("discovery: %v", err)
		}
		c.mapper = restmapper.NewDiscoveryRESTMapper(resources)
		c.groups = map[string]bool{}
		for _, g := range resources {
			c.groups[g.Group.Name] = true
		}
		for _, gvk := range want {
			if _, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
				return false, fmt.Sprintf("discovery: %s not discoverable", gvk)
			}
		}
		return true, ""
	})
}

// notServedError says the server serves no API group of the object's
// apiVersion at all: a third-party kind whose CRD is not available here.
// A served group without the object's version or kind is a plain error.
type notServedError struct{ gvk schema.GroupVersionKind }

func (e *notServedError) Error() string {
	return fmt.Sprintf("API group %q is not served (no CRD available for %s)", e.gvk.Group, e.gvk.Kind)
}

// apply server-side-applies u with strict field validation: unknown or
// duplicate fields are errors, not warnings. With dryRun the server runs
// every admission and validation step but stores nothing. Objects
// without a namespace that need one go to defaultNS. It returns a
// *notServedError if u's API group is not served.
func (c *cluster) apply(ctx context.Context, u *unstructured.Unstructured, defaultNS string, dryRun bool) error {
	gvk := u.GroupVersionKind()
	if gvk.Kind == "" || gvk.Version == "" {
		return fmt.Errorf("object %q has no apiVersion or kind", u.GetName())
	}
	if !c.groups[gvk.Group] {
		return &notServedError{gvk}
	}
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return fmt.Errorf("apiVersion %q kind %q: %w", u.GetAPIVersion(), gvk.Kind, err)
	}
	var ri dynamic.ResourceInterface = c.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ns := u.GetNamespace()
		if ns == "" {
			ns = defaultNS
		}
		if ns == "" {
			return fmt.Errorf("%s %s: namespaced, but has no namespace", gvk.Kind, u.GetName())
		}
		ri = c.dyn.Resource(m.Resource).Namespace(ns)
	} else if u.GetNamespace() != "" {
		return fmt.Errorf("%s %s is cluster-scoped but names namespace %q", gvk.Kind, u.GetName(), u.GetNamespace())
	}
	body, err := json.Marshal(u.Object)
	if err != nil {
		return err
	}
	force := true
	opts := metav1.PatchOptions{FieldManager: fieldManager, Force: &force, FieldValidation: metav1.FieldValidationStrict}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err = ri.Patch(ctx, u.GetName(), types.ApplyPatchType, body, opts)
	return err
}

// decodeFile reads every object of a multi-document YAML file.
func decodeFile(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	objs, err := decodeYAML(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return objs, nil
}

func decodeYAML(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, err
		}
		if obj != nil {
			out = append(out, &unstructured.Unstructured{Object: obj})
		}
	}
}
