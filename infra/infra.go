// Package infra holds labkeep's Kubernetes manifests (the YAML files in
// base/, applied in production with `kubectl apply -k infra/overlays/<env>`
// or `kubectl apply -k infra/base/`) and a small applier so tests and
// `make run` install exactly the same RBAC, quota and lab templates into the
// local control plane — with the two namespaces renamed, so parallel tests
// don't collide.
package infra

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
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
// namespaces renamed per p, including RoleBinding subjects and Namespace
// objects themselves.
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
			out = append(out, u)
		}
	}
	return out, nil
}

// Apply creates the named manifests' objects (renamed per p) with rc;
// objects that already exist are left as they are.
func Apply(ctx context.Context, rc *rest.Config, p Placement, names ...string) error {
	objs, err := Objects(p, names...)
	if err != nil {
		return err
	}
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
