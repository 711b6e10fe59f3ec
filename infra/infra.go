// Package infra holds labkeep's Kubernetes manifests (the YAML files in
// base/, applied in production with `kubectl apply -k infra/overlays/<env>`
// or `kubectl apply -k infra/base/`) and a small applier so tests and
// `make run` install exactly the same RBAC, quota and lab templates into the
// local control plane — with the two namespaces renamed, so parallel tests
// don't collide.
package infra

import (
	"bytes"
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/netip"
	neturl "net/url"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

//go:embed base/*.yaml
var embedded embed.FS

// files are the manifests of base/, by their names there.
var files = func() fs.FS {
	f, err := fs.Sub(embedded, "base")
	if err != nil {
		panic(err) // base/ is embedded: it exists
	}
	return f
}()

// The namespaces the manifests are written for.
const (
	FunctionsNamespace = "labkeep"
	SessionsNamespace  = "labkeep-sessions"
)

// ServiceAccount is the functions' ServiceAccount in FunctionsNamespace.
const ServiceAccount = "labkeep-functions"

// VMQuota is the ResourceQuota of resourcequota.yaml that caps
// VirtualMachines in the sessions namespace (keep it equal to
// LABKEEP_MAX_CONCURRENT_VMS).
const VMQuota = "labkeep-vms"

// PodQuota is the ResourceQuota of resourcequota.yaml that caps workspace
// Pods (scope Terminating: Pods with a deadline) in the sessions
// namespace (keep it equal to LABKEEP_MAX_CONCURRENT_PODS).
const PodQuota = "labkeep-workspaces"

// SessionsDefaultDeny is the NetworkPolicy of namespaces.yaml that denies
// every Pod of the sessions namespace all traffic that no session's own
// policy allows: it belongs to the namespace, never to a session.
const SessionsDefaultDeny = "labkeep-default-deny"

//go:embed guardian/workspace-pod.yaml
var workspacePod []byte

// WorkspacePod is the one definition of a workspace Pod (guardian as a
// native sidecar beside the student's container): the Kubernetes adapter
// builds every workspace Pod from it, filling in only what differs per
// session (names, labels, owner, images, SSH port, resources, deadline).
func WorkspacePod() []byte { return bytes.Clone(workspacePod) }

// File returns the content of one manifest, e.g. "labs.yaml".
func File(name string) ([]byte, error) { return fs.ReadFile(files, name) }

// Placement renames the manifests' namespaces when applying.
type Placement struct {
	Functions string // replaces "labkeep"
	Sessions  string // replaces "labkeep-sessions"
}

func (p Placement) rename(ns string) string {
	switch ns {
	case FunctionsNamespace:
		if p.Functions != "" {
			return p.Functions
		}
	case SessionsNamespace:
		if p.Sessions != "" {
			return p.Sessions
		}
	}
	return ns
}

// Objects decodes the named manifests (multi-document YAML) with
// namespaces renamed per p, including RoleBinding subjects, Namespace
// objects themselves and the admission policies' bindings (the sessions
// namespace they select and read their parameters from; with that
// namespace renamed, a binding also takes its name as a suffix, so
// placements side by side on one cluster each have their own).
func Objects(p Placement, names ...string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, name := range names {
		data, err := fs.ReadFile(files, name)
		if err != nil {
			return nil, err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var obj map[string]any
			if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			if obj == nil {
				continue
			}
			u := &unstructured.Unstructured{Object: obj}
			if u.GetKind() == "Namespace" {
				u.SetName(p.rename(u.GetName()))
			} else {
				u.SetNamespace(p.rename(u.GetNamespace()))
			}
			if subjects, ok, _ := unstructured.NestedSlice(u.Object, "subjects"); ok {
				for _, s := range subjects {
					if m, ok := s.(map[string]any); ok {
						if ns, ok := m["namespace"].(string); ok {
							m["namespace"] = p.rename(ns)
						}
					}
				}
				if err := unstructured.SetNestedSlice(u.Object, subjects, "subjects"); err != nil {
					return nil, err
				}
			}
			if u.GetKind() == "ValidatingAdmissionPolicyBinding" {
				if err := p.placeBinding(u); err != nil {
					return nil, fmt.Errorf("%s: %w", name, err)
				}
			}
			out = append(out, u)
		}
	}
	return out, nil
}

// placeBinding points an admission binding at the renamed sessions
// namespace: its namespaceSelector, its paramRef and, when renamed, its
// name.
func (p Placement) placeBinding(u *unstructured.Unstructured) error {
	sessions := p.rename(SessionsNamespace)
	if _, ok, _ := unstructured.NestedMap(u.Object, "spec", "paramRef"); ok {
		if err := unstructured.SetNestedField(u.Object, sessions, "spec", "paramRef", "namespace"); err != nil {
			return err
		}
	}
	if err := unstructured.SetNestedStringMap(u.Object, map[string]string{corev1.LabelMetadataName: sessions},
		"spec", "matchResources", "namespaceSelector", "matchLabels"); err != nil {
		return err
	}
	if sessions != SessionsNamespace {
		u.SetName(u.GetName() + "-" + sessions)
	}
	return nil
}

// AdmissionConfigMap is the admission policy's parameters
// (admission-policy.yaml), in the sessions namespace.
const AdmissionConfigMap = "labkeep-admission"

// Admission is what one environment's admission parameters (the
// AdmissionConfigMap) hold besides admission-policy.yaml's own.
type Admission struct {
	// Env is the LABKEEP_ENV of the functions of the placement's
	// functions namespace: it replaces the file's env.<namespace> entries.
	Env string
	// Images are more entries of the image allowlist (images):
	// repositories or prefixes ending in "/".
	Images []string
	// Data replaces further parameters by key (guardianImages,
	// runtimeClasses, …).
	Data map[string]string
}

// WebhookPin is the guardianWebhooks entry of the admission parameters
// that admits the functions' egress rule to guardian's webhook at url
// (LABKEEP_GUARDIAN_WEBHOOK_URL): its address:port ([address]:port for
// IPv6), the port explicit (80 for http, 443 for https). A URL naming a
// host name has no such rule (the functions write none), so "".
func WebhookPin(url string) (string, error) {
	u, err := neturl.Parse(url)
	if err != nil {
		return "", fmt.Errorf("guardian webhook URL: %w", err)
	}
	addr, err := netip.ParseAddr(u.Hostname())
	if err != nil {
		return "", nil // a host name
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	if port == "" {
		return "", fmt.Errorf("guardian webhook URL %q: no port and scheme %q", url, u.Scheme)
	}
	return net.JoinHostPort(addr.String(), port), nil
}

// AdmissionObjects are admission-policy.yaml's objects placed per p
// (Objects) with a's parameters.
func AdmissionObjects(p Placement, a Admission) ([]*unstructured.Unstructured, error) {
	if a.Env == "" {
		return nil, errors.New("admission parameters: no environment")
	}
	objs, err := Objects(p, "admission-policy.yaml")
	if err != nil {
		return nil, err
	}
	for _, o := range objs {
		if o.GetKind() != "ConfigMap" || o.GetName() != AdmissionConfigMap {
			continue
		}
		data, _, err := unstructured.NestedStringMap(o.Object, "data")
		if err != nil {
			return nil, err
		}
		for k := range data {
			if strings.HasPrefix(k, "env.") {
				delete(data, k)
			}
		}
		data["env."+p.rename(FunctionsNamespace)] = a.Env
		if len(a.Images) > 0 {
			data["images"] = strings.Join(append(strings.Fields(data["images"]), a.Images...), "\n")
		}
		maps.Copy(data, a.Data)
		if err := unstructured.SetNestedStringMap(o.Object, data, "data"); err != nil {
			return nil, err
		}
		return objs, nil
	}
	return nil, fmt.Errorf("admission-policy.yaml has no ConfigMap %s", AdmissionConfigMap)
}

// ApplyAdmission creates AdmissionObjects(p, a) with rc (objects that
// already exist are left as they are; the parameters first, so the binding
// never acts without them) and waits until the API server enforces the
// policy for the functions' ServiceAccount of p: it refuses a Secret
// without labkeep's labels and admits one with them. Until then a create
// of the functions would pass unchecked, or be refused for want of
// parameters the API server has not seen yet. It waits a minute at most.
func ApplyAdmission(ctx context.Context, rc *rest.Config, p Placement, a Admission) error {
	objs, err := AdmissionObjects(p, a)
	if err != nil {
		return err
	}
	slices.SortStableFunc(objs, func(x, y *unstructured.Unstructured) int {
		return cmp.Compare(applyOrder(x.GetKind()), applyOrder(y.GetKind()))
	})
	if err := create(ctx, rc, objs); err != nil {
		return err
	}
	fn := rest.CopyConfig(rc)
	fnNamespace := p.rename(FunctionsNamespace)
	fn.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + fnNamespace + ":" + ServiceAccount,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + fnNamespace, "system:authenticated"},
	}
	cs, err := kubernetes.NewForConfig(fn)
	if err != nil {
		return err
	}
	secrets := cs.CoreV1().Secrets(p.rename(SessionsNamespace))
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	labelled := map[string]string{"labkeep.io/env": a.Env, "labkeep.io/session": "admission-probe",
		"labkeep.io/role": "probe", "app.kubernetes.io/managed-by": "labkeep"}
	probe := func(labels map[string]string) error {
		_, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "labkeep-admission-probe", Labels: labels},
			Type: corev1.SecretTypeOpaque}, dryRun)
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var last error
	for {
		refused := probe(nil)
		if refused != nil && strings.Contains(refused.Error(), "labkeep admission: ") {
			if last = probe(labelled); last == nil {
				return nil
			}
		} else {
			last = fmt.Errorf("a Secret without labkeep's labels: %v", refused)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the admission policy is not in force for %s: %v", fnNamespace, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// applyOrder puts an admission policy's parameters before the policy and
// the policy before its bindings.
func applyOrder(kind string) int {
	return map[string]int{"ConfigMap": 0, "ValidatingAdmissionPolicy": 1, "ValidatingAdmissionPolicyBinding": 2}[kind]
}

// Apply creates the named manifests' objects (renamed per p) with rc;
// objects that already exist are left as they are.
func Apply(ctx context.Context, rc *rest.Config, p Placement, names ...string) error {
	objs, err := Objects(p, names...)
	if err != nil {
		return err
	}
	return create(ctx, rc, objs)
}

// create creates objs in order with rc, leaving those that already exist
// as they are.
func create(ctx context.Context, rc *rest.Config, objs []*unstructured.Unstructured) error {
	dc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	for _, u := range objs {
		gvk := u.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("%s %s: %w", gvk.Kind, u.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if u.GetNamespace() != "" {
			ri = dyn.Resource(m.Resource).Namespace(u.GetNamespace())
		}
		if _, err := ri.Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %s %s/%s: %w", gvk.Kind, u.GetNamespace(), u.GetName(), err)
		}
	}
	return nil
}
