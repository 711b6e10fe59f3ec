package session_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"labkeep/localrun/stacktest"
	"labkeep/shared/session"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// refuseNode makes the real API server refuse to create any VirtualMachine
// of node in e's sessions namespace (a ValidatingAdmissionPolicy: the same
// kind of refusal a webhook, quota or policy gives in production). It
// returns once the policy is in force, and a func lifting it.
func refuseNode(t *testing.T, e *env, node string) func() {
	t.Helper()
	ctx := context.Background()
	name := "refuse-" + e.name
	stacktest.Refuse(t, st, stacktest.Refusal{
		Name: name, Namespace: e.ns,
		Group: "kubevirt.io", Resource: "virtualmachines", Operations: []admissionv1.OperationType{admissionv1.Create},
		Expression: `!has(object.metadata.labels) || !('labkeep.io/node' in object.metadata.labels) || object.metadata.labels['labkeep.io/node'] != '` + node + `'`,
		Message:    "injected fault: " + node + " refused",
	})
	adm := e.kube.AdmissionregistrationV1()
	lift := func() {
		_ = adm.ValidatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = adm.ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{})
	}
	// Probe with a server-side dry run until the policy bites.
	probe := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
		"metadata": map[string]any{"name": "probe", "labels": map[string]any{"labkeep.io/node": node}},
		"spec":     map[string]any{"runStrategy": "Halted", "template": map[string]any{"spec": map[string]any{"domain": map[string]any{"devices": map[string]any{}}}}},
	}}
	waitFor(t, 30*time.Second, "admission policy in force", func() bool {
		_, err := e.dyn.Resource(gvrVM).Namespace(e.ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsInvalid(err) || apierrors.IsForbidden(err)
	})
	return func() {
		lift()
		// A deleted policy stops biting at the API server's next policy-cache
		// refresh: usually within a second, but seen to take over 30 s on a
		// loaded 2-core machine.
		waitFor(t, 2*time.Minute, "admission policy lifted", func() bool {
			_, err := e.dyn.Resource(gvrVM).Namespace(e.ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err == nil
		})
	}
}

// The second worker's create fails in the middle of a 3-node
// provisioning: everything created is gone, the row is failed with the
// reason, and a retry succeeds at once.
func TestFaultMidThreeNodeProvisioning(t *testing.T) {
	e := newEnv(t, envOptions{})
	lift := refuseNode(t, e, "worker-2")
	tok := e.token("carol", "student")

	r := e.open("carol", "k8s-cluster")
	if r.status != 502 || r.code != "provisioning_failed" {
		t.Fatalf("open with the fault = %d %s", r.status, r.body)
	}
	// The student reads a fixed message and reason, never the API server's
	// refusal; the full reason is stored, logged and shown to admins.
	noInternals(t, "failed open", r)
	if r.session.Status != "failed" || r.session.FailureReason != session.PublicReasonProvisioning {
		t.Errorf("failed session = status %q reason %q, want failed %q", r.session.Status, r.session.FailureReason, session.PublicReasonProvisioning)
	}
	failedID := r.session.ID
	if n := e.count(`SELECT count(*) FROM sessions WHERE id = $1 AND failure_reason LIKE 'provisioning_failed: %worker-2%injected fault: worker-2 refused%'`, failedID); n != 1 {
		t.Errorf("stored reason of %s lacks the full refusal", failedID)
	}
	admin := e.do("GET", "/getSession?student=carol&id="+failedID, e.token("root", "admin"), "", "")
	if admin.status != 200 || !strings.Contains(admin.session.FailureReason, "worker-2") || !strings.Contains(admin.session.FailureReason, "injected fault") {
		t.Errorf("admin getSession = %d, reason %q; want the full refusal", admin.status, admin.session.FailureReason)
	}
	// Everything created before the fault (anchor, 3 Secrets, NetworkPolicy,
	// Service, control and worker-1 VMs) is gone.
	e.waitNoObjects(20 * time.Second)
	if got := e.rows(); len(got) != 1 || !strings.Contains(got[0], failedID+" carol failed ") {
		t.Errorf("rows = %v, want the one failed session", got)
	}
	g := e.do("GET", "/getSession", tok, "", "")
	if g.status != 200 || g.session.Status != "failed" || g.session.FailureReason != session.PublicReasonProvisioning {
		t.Errorf("getSession after failure = %d %s", g.status, g.body)
	}
	noInternals(t, "getSession after failure", g)

	lift()
	retry := e.open("carol", "k8s-cluster")
	if retry.status != 201 {
		t.Fatalf("retry = %d %s", retry.status, retry.body)
	}
	s := e.waitRunning("carol", 30*time.Second)
	var nodes []string
	for _, n := range s.Nodes {
		nodes = append(nodes, n.Name+"/"+n.Role)
		if !n.Ready {
			t.Errorf("node %s not ready", n.Name)
		}
	}
	if strings.Join(nodes, ",") != "control/control,worker-1/worker,worker-2/worker" {
		t.Errorf("nodes = %v", nodes)
	}
	want := []string{
		"Job/lk-" + s.ID + "-anchor",
		"NetworkPolicy/lk-" + s.ID,
		"Secret/lk-" + s.ID + "-control-cloudinit",
		"Secret/lk-" + s.ID + "-worker-1-cloudinit",
		"Secret/lk-" + s.ID + "-worker-2-cloudinit",
		"Service/lk-" + s.ID,
		"VirtualMachine/lk-" + s.ID + "-control",
		"VirtualMachine/lk-" + s.ID + "-worker-1",
		"VirtualMachine/lk-" + s.ID + "-worker-2",
		// virt-controller (virtsim) copies the template labels to VMIs.
		"VirtualMachineInstance/lk-" + s.ID + "-control",
		"VirtualMachineInstance/lk-" + s.ID + "-worker-1",
		"VirtualMachineInstance/lk-" + s.ID + "-worker-2",
	}
	// KubeVirt's own virt-launcher Pods (one per VMI, carrying its labels)
	// are not labkeep's objects.
	var got []string
	for _, o := range e.objects("labkeep.io/session=" + s.ID) {
		if !strings.HasPrefix(o, "Pod/virt-launcher-") {
			got = append(got, o)
		}
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("objects of the retried session:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if c := e.do("POST", "/closeSession", tok, "", ""); c.status != 200 {
		t.Fatalf("close = %d %s", c.status, c.body)
	}
	e.waitNoObjects(20 * time.Second)
}
