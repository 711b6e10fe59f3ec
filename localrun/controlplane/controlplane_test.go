package controlplane

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"labkeep/localrun/poll"
)

var vmGVR = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachines"}

// shared is the control plane most tests in this package use; the
// start/stop leak test starts its own.
var shared *ControlPlane

func TestMain(m *testing.M) {
	ctx := context.Background()
	cp, err := Start(ctx, Options{Progress: os.Stderr, StopOnSignal: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "control plane:", err)
		os.Exit(1)
	}
	shared = cp
	code := m.Run()
	cp.Stop()
	os.Exit(code)
}

func clients(t *testing.T) (*kubernetes.Clientset, dynamic.Interface) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(shared.Admin)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(shared.Admin)
	if err != nil {
		t.Fatal(err)
	}
	return cs, dyn
}

func newNamespace(t *testing.T, cs *kubernetes.Clientset, prefix string) string {
	t.Helper()
	ns, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	return ns.Name
}

func vm(name string, owner *metav1.OwnerReference) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"runStrategy": "Always", "template": map[string]any{"spec": map[string]any{"domain": map[string]any{"devices": map[string]any{}}}}},
	}}
	if owner != nil {
		u.SetOwnerReferences([]metav1.OwnerReference{*owner})
	}
	return u
}

// A VM owned by a Job with a short activeDeadlineSeconds and
// ttlSecondsAfterFinished 0 is deleted by Kubernetes alone: the Job
// controller fails the Job, the TTL controller deletes it, the garbage
// collector deletes the VM. No labkeep code runs after the creates.
func TestDeadlineAnchorDeletesVM(t *testing.T) {
	cs, dyn := clients(t)
	ctx := context.Background()
	ns := newNamespace(t, cs, "anchor")
	deadline, ttl := int64(3), int32(0)
	// Watch the Job from before its creation, to see the chain of events:
	// Failed (DeadlineExceeded), then deleted.
	w, err := cs.BatchV1().Jobs(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	failedAt, deletedAt := make(chan time.Time, 1), make(chan time.Time, 1)
	go func() {
		for ev := range w.ResultChan() {
			j, ok := ev.Object.(*batchv1.Job)
			if !ok {
				continue
			}
			if ev.Type == watch.Deleted {
				deletedAt <- time.Now()
				return
			}
			for _, c := range j.Status.Conditions {
				if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue && c.Reason == "DeadlineExceeded" {
					select {
					case failedAt <- time.Now():
					default:
					}
				}
			}
		}
	}()
	created := time.Now()
	job, err := cs.BatchV1().Jobs(ns).Create(ctx, &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "anchor"},
		Spec: batchv1.JobSpec{
			ActiveDeadlineSeconds:   &deadline,
			TTLSecondsAfterFinished: &ttl,
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10"}},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr := true
	owner := &metav1.OwnerReference{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID, BlockOwnerDeletion: &tr}
	if _, err := dyn.Resource(vmGVR).Namespace(ns).Create(ctx, vm("student-vm", owner), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The VM must still be there before the deadline: the anchor, not the
	// test, is what removes it.
	if _, err := dyn.Resource(vmGVR).Namespace(ns).Get(ctx, "student-vm", metav1.GetOptions{}); err != nil {
		t.Fatalf("VM gone before the deadline: %v", err)
	}
	time.Sleep(time.Second)
	if _, err := dyn.Resource(vmGVR).Namespace(ns).Get(ctx, "student-vm", metav1.GetOptions{}); err != nil {
		j, _ := cs.BatchV1().Jobs(ns).Get(ctx, "anchor", metav1.GetOptions{})
		t.Fatalf("VM gone 1s after create, before the deadline: %v; job: %+v", err, j)
	}
	poll.Eventually(t, 90*time.Second, func() (bool, string) {
		_, err := dyn.Resource(vmGVR).Namespace(ns).Get(ctx, "student-vm", metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("VM deleted by the garbage collector: %v", err)
		}
		return apierrors.IsNotFound(err), "VM not yet deleted by the garbage collector"
	})
	vmGone := time.Since(created)
	var failed, deleted time.Time
	select {
	case failed = <-failedAt:
	case <-time.After(10 * time.Second):
		t.Fatal("the anchor Job was never seen Failed with reason DeadlineExceeded")
	}
	select {
	case deleted = <-deletedAt:
	case <-time.After(10 * time.Second):
		t.Fatal("the anchor Job was never deleted (TTL controller)")
	}
	if failed.Sub(created) < time.Duration(deadline)*time.Second-time.Second {
		t.Fatalf("Job failed %s after creation, before its %ds deadline", failed.Sub(created), deadline)
	}
	t.Logf("deadline %ds: Job failed at +%s, deleted at +%s, VM gone by +%s",
		deadline, failed.Sub(created).Round(10*time.Millisecond), deleted.Sub(created).Round(10*time.Millisecond), vmGone.Round(100*time.Millisecond))
}

// A ResourceQuota on count/virtualmachines.kubevirt.io refuses
// the VM beyond the limit with a clear Forbidden error.
func TestQuotaRefusesThirdVM(t *testing.T) {
	cs, dyn := clients(t)
	ctx := context.Background()
	ns := newNamespace(t, cs, "quota")
	_, err := cs.CoreV1().ResourceQuotas(ns).Create(ctx, &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "vms"},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"count/virtualmachines.kubevirt.io": resource.MustParse("2")}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Until the quota controller has computed usage, admission refuses every
	// create ("status unknown"); wait for status.used to be filled.
	poll.Eventually(t, 30*time.Second, func() (bool, string) {
		q, err := cs.CoreV1().ResourceQuotas(ns).Get(ctx, "vms", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("quota usage computed: %v", err)
		}
		_, ok := q.Status.Used["count/virtualmachines.kubevirt.io"]
		return ok, "quota usage not computed yet"
	})
	for i := 1; i <= 2; i++ {
		if _, err := dyn.Resource(vmGVR).Namespace(ns).Create(ctx, vm(fmt.Sprintf("vm-%d", i), nil), metav1.CreateOptions{}); err != nil {
			t.Fatalf("VM %d of 2 refused: %v", i, err)
		}
	}
	_, refusal := dyn.Resource(vmGVR).Namespace(ns).Create(ctx, vm("vm-3", nil), metav1.CreateOptions{})
	if !apierrors.IsForbidden(refusal) {
		t.Fatalf("third VM: want Forbidden, got %v", refusal)
	}
	if msg := refusal.Error(); !strings.Contains(msg, "exceeded quota") || !strings.Contains(msg, "count/virtualmachines.kubevirt.io") {
		t.Fatalf("error does not say which quota was exceeded: %q", msg)
	}
	list, err := dyn.Resource(vmGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 2 {
		t.Fatalf("want 2 VMs after the refusal, got %d", len(list.Items))
	}
	t.Logf("third VM refused: %v", refusal)
}

// A ServiceAccount config has exactly the RBAC bound to it: none here.
func TestServiceAccountConfigIsNotAdmin(t *testing.T) {
	ctx := context.Background()
	cfg, err := shared.ServiceAccountConfig(ctx, "sa-test", "nobody")
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = cs.CoreV1().Secrets("sa-test").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("unbound ServiceAccount listing Secrets: want Forbidden, got %v", err)
	}
	if !strings.Contains(err.Error(), "system:serviceaccount:sa-test:nobody") {
		t.Fatalf("error should name the ServiceAccount: %v", err)
	}
}
