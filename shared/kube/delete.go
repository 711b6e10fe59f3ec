package kube

import (
	"context"
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"labkeep/shared/session"
)

// deleteAttempts bounds how often one delete reads the object again after
// it changed between the read and the delete (a Pod's or VM's status moves
// its resourceVersion).
const deleteAttempts = 5

// Teardown implements session.Teardowner: it deletes session.Objects(s) by
// name, with no list of the namespace, in the one delete order (a running
// VM is never left without its owner), the anchor last with background
// propagation so the garbage collector also removes anything it owns that
// a name did not reach (e.g. DataVolumes). Each object is deleted only if
// it carries this environment's labkeep.io/env and s's labkeep.io/session
// (see Delete); a refusal is a session.ErrNotOurs error. Objects already gone
// count as deleted; every delete is tried even if an earlier one failed.
//
// Cloud-init Secrets are never deleted by name: the functions may not read
// Secrets (infra/base/rbac.yaml), so a Secret's labels cannot be checked, and a
// blind delete by name could take another environment's. Each is owned by
// its session's anchor, so the garbage collector removes it when the
// anchor (checked) goes.
func (c *Cluster) Teardown(ctx context.Context, s session.Session) error {
	var errs []error
	for _, r := range session.Objects(s) {
		if r.Kind == session.KindSecret {
			continue
		}
		if err := c.deleteOwned(ctx, r, s.ID); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Delete implements reap.Cluster for the reaper's orphans and home
// readers: it removes one object only if it carries this environment's
// labkeep.io/env and a labkeep.io/session whose objects its name is one
// of, or is a home reader Pod of this environment named as one; otherwise
// it refuses with session.ErrNotOurs. An object already gone (or, with a UID, one
// replaced by a newer object of the same name) counts as deleted. The
// anchor is deleted with background propagation so the garbage collector
// removes what it owns.
func (c *Cluster) Delete(ctx context.Context, r session.ObjectRef) error {
	return c.deleteOwned(ctx, r, "")
}

// deleteOwned reads r (one get), checks its labels (sessionID "": the session its
// name belongs to), and deletes it with preconditions on the UID and
// resourceVersion it read, so what is deleted is exactly what was checked:
// an object relabelled or replaced in between makes the delete conflict,
// and it is read and checked again.
func (c *Cluster) deleteOwned(ctx context.Context, r session.ObjectRef, sessionID string) error {
	api, err := c.api(r.Kind)
	if err != nil {
		return err
	}
	for range deleteAttempts {
		m, err := c.read(ctx, api, r.Name)
		if err != nil {
			return fmt.Errorf("deleting %s: reading it: %w", r, err)
		}
		if m == nil || (r.UID != "" && string(m.GetUID()) != r.UID) {
			return nil
		}
		if err := c.owns(r, m, sessionID); err != nil {
			return err
		}
		uid, rv := m.GetUID(), m.GetResourceVersion()
		bg := metav1.DeletePropagationBackground
		opts := metav1.DeleteOptions{PropagationPolicy: &bg, Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}}
		dctx, cancel := c.call(ctx)
		err = api.delete(dctx, r.Name, opts)
		cancel()
		switch {
		case err == nil, apierrors.IsNotFound(err):
			return nil
		case apierrors.IsConflict(err):
			continue
		default:
			return fmt.Errorf("deleting %s: %w", r, err)
		}
	}
	return fmt.Errorf("deleting %s: it changed between each of %d reads and deletes", r, deleteAttempts)
}

// owns checks that m, read for r, is this environment's and the session's
// (sessionID, or the one its name belongs to when sessionID is empty).
func (c *Cluster) owns(r session.ObjectRef, m metav1.Object, sessionID string) error {
	l := m.GetLabels()
	if env := l[LabelEnv]; env != c.cfg.Env {
		return fmt.Errorf("%w %s: it belongs to environment %q (%s), not to this labkeep's environment %q",
			session.ErrNotOurs, r, env, LabelEnv, c.cfg.Env)
	}
	got := l[LabelSession]
	if sessionID == "" && r.Kind == session.KindPod && strings.HasPrefix(r.Name, HomeReaderName("home-")) {
		if !isHomeReader(l, c.cfg.Env) {
			return fmt.Errorf("%w %s: it is not a home reader of environment %q", session.ErrNotOurs, r, c.cfg.Env)
		}
		return nil
	}
	if sessionID == "" {
		if got == "" || !namedFor(r.Name, got) {
			return fmt.Errorf("%w %s: its %s %q is not the session its name belongs to", session.ErrNotOurs, r, LabelSession, got)
		}
		return nil
	}
	if got != sessionID {
		return fmt.Errorf("%w %s: it belongs to session %q (%s), not to session %q", session.ErrNotOurs, r, got, LabelSession, sessionID)
	}
	return nil
}

// namedFor reports whether name is one of session id's object names: every
// one is NetworkName(id) or starts with it and a dash (session/objects.go).
func namedFor(name, id string) bool {
	prefix := session.NetworkName(id)
	return name == prefix || (len(name) > len(prefix) && name[:len(prefix)+1] == prefix+"-")
}

// kindAPI is what a delete needs of one kind's client: a get and a
// delete.
type kindAPI struct {
	get    func(context.Context, string, metav1.GetOptions) (metav1.Object, error)
	delete func(context.Context, string, metav1.DeleteOptions) error
}

// api is kind's client in the sessions namespace. Secrets have none: they
// cannot be read, so never checked, so never deleted by name.
func (c *Cluster) api(kind session.ObjectKind) (kindAPI, error) {
	ns := c.cfg.Namespace
	switch kind {
	case session.KindVirtualMachine:
		x := c.virt.KubevirtV1().VirtualMachines(ns)
		return kindAPI{getting(x.Get), x.Delete}, nil
	case session.KindPod:
		x := c.kube.CoreV1().Pods(ns)
		return kindAPI{getting(x.Get), x.Delete}, nil
	case session.KindService:
		x := c.kube.CoreV1().Services(ns)
		return kindAPI{getting(x.Get), x.Delete}, nil
	case session.KindNetworkPolicy:
		x := c.kube.NetworkingV1().NetworkPolicies(ns)
		return kindAPI{getting(x.Get), x.Delete}, nil
	case session.KindAnchor:
		x := c.kube.BatchV1().Jobs(ns)
		return kindAPI{getting(x.Get), x.Delete}, nil
	case session.KindSecret:
		return kindAPI{}, errors.New("delete: Secrets are never deleted by name (their labels cannot be read): they go with their anchor")
	}
	return kindAPI{}, fmt.Errorf("delete: unknown kind %q", kind)
}

func getting[T metav1.Object](get func(context.Context, string, metav1.GetOptions) (T, error)) func(context.Context, string, metav1.GetOptions) (metav1.Object, error) {
	return func(ctx context.Context, name string, o metav1.GetOptions) (metav1.Object, error) {
		return get(ctx, name, o)
	}
}

// read returns the metadata of the object called name, or nil if there is
// none.
func (c *Cluster) read(ctx context.Context, api kindAPI, name string) (metav1.Object, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	m, err := api.get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return m, nil
}
