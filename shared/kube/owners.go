package kube

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"labkeep/shared/access"
	"labkeep/shared/labs"
	"labkeep/shared/session"
)

// Owns reports whether the Pod (kind pod) or VMI (kind vm) named name
// in the sessions namespace is session's own in this environment: its
// labkeep.io/env and labkeep.io/session labels, which only labkeep's own
// objects carry (the admission policy refuses them on anything else). It
// is asked before every call into a workspace or console (the web
// terminal, the cleanup button), because the sessions namespace may be
// shared by environments and the functions' ServiceAccount may exec into
// any Pod there. A mismatch wraps access.ErrForbidden; no such object,
// session.ErrNotRunning.
func (c *Cluster) Owns(ctx context.Context, kind labs.Kind, name, sessionID string) error {
	ctx, cancel := c.call(ctx)
	defer cancel()
	var obj metav1.Object
	var err error
	what := "workspace Pod"
	switch kind {
	case labs.KindPod:
		obj, err = c.kube.CoreV1().Pods(c.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
	case labs.KindVM:
		what = "VM"
		obj, err = c.virt.KubevirtV1().VirtualMachineInstances(c.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
	default:
		return fmt.Errorf("kube: no objects of lab kind %q", kind)
	}
	var labels map[string]string
	if err == nil {
		labels = obj.GetLabels()
	}
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w: the %s %s of session %s is not there (starting again?)", session.ErrNotRunning, what, name, sessionID)
	case err != nil:
		return fmt.Errorf("reading %s %s: %w", what, name, err)
	case labels[LabelEnv] != c.cfg.Env || labels[LabelSession] != sessionID:
		// Short first: a terminal's close reason holds 123 bytes.
		return fmt.Errorf("%w: %s %s is not this session's here (it carries %s=%q, %s=%q; this is %s of %s)", access.ErrForbidden,
			what, name, LabelEnv, labels[LabelEnv], LabelSession, labels[LabelSession], sessionID, c.cfg.Env)
	}
	return nil
}
