package virtsim_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"labkeep/localrun/stack"
	"labkeep/localrun/stacktest"
	"labkeep/localrun/virtsim"
)

var st *stack.Stack

func TestMain(m *testing.M) {
	stacktest.Main(m, &st, stack.Options{VirtSim: virtsim.Options{BootDelay: 500 * time.Millisecond}})
}

type env struct {
	t   *testing.T
	ns  string
	dyn dynamic.Interface
}

func newEnv(t *testing.T) *env {
	t.Helper()
	cs, dyn := stacktest.AdminClients(t, st)
	ns, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "virtsim-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{}) })
	return &env{t: t, ns: ns.Name, dyn: dyn}
}

func (e *env) createVM(name string, annotations map[string]string, dataVolume string) {
	e.t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{
			"runStrategy": "Always",
			"template": map[string]any{
				"metadata": map[string]any{"labels": map[string]any{"labkeep.io/role": "control"}},
				"spec": map[string]any{
					"domain":         map[string]any{"devices": map[string]any{}, "resources": map[string]any{"requests": map[string]any{"memory": "4Gi"}}},
					"readinessProbe": map[string]any{"tcpSocket": map[string]any{"port": int64(22)}},
				},
			},
		},
	}}
	if annotations[withoutProbe] == "true" {
		unstructured.RemoveNestedField(u.Object, "spec", "template", "spec", "readinessProbe")
		delete(annotations, withoutProbe)
	}
	if dataVolume != "" {
		_ = unstructured.SetNestedSlice(u.Object, []any{map[string]any{
			"metadata": map[string]any{"name": dataVolume},
			"spec":     map[string]any{"source": map[string]any{"pvc": map[string]any{"namespace": "golden", "name": "ubuntu"}}, "storage": map[string]any{}},
		}}, "spec", "dataVolumeTemplates")
	}
	u.SetAnnotations(annotations)
	if _, err := e.dyn.Resource(virtsim.VirtualMachines).Namespace(e.ns).Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) get(gvr any, name string) (*unstructured.Unstructured, error) {
	switch gvr {
	case "vm":
		return e.dyn.Resource(virtsim.VirtualMachines).Namespace(e.ns).Get(context.Background(), name, metav1.GetOptions{})
	case "vmi":
		return e.dyn.Resource(virtsim.VirtualMachineInstances).Namespace(e.ns).Get(context.Background(), name, metav1.GetOptions{})
	default:
		return e.dyn.Resource(virtsim.DataVolumes).Namespace(e.ns).Get(context.Background(), name, metav1.GetOptions{})
	}
}

func (e *env) eventually(what string, cond func() bool) time.Duration {
	e.t.Helper()
	start := time.Now()
	stacktest.Eventually(e.t, 30*time.Second, func() (bool, string) { return cond(), what })
	return time.Since(start)
}

func (e *env) vmState(name string) (ready bool, printable string, created bool) {
	vm, err := e.get("vm", name)
	if err != nil {
		return false, "", false
	}
	ready, _, _ = unstructured.NestedBool(vm.Object, "status", "ready")
	created, _, _ = unstructured.NestedBool(vm.Object, "status", "created")
	printable, _, _ = unstructured.NestedString(vm.Object, "status", "printableStatus")
	return
}

func (e *env) vmiPhase(name string) string {
	vmi, err := e.get("vmi", name)
	if err != nil {
		return "<none>"
	}
	p, _, _ := unstructured.NestedString(vmi.Object, "status", "phase")
	return p
}

// A VM becomes ready; its VMI is controlled by it.
func TestVMBecomesReady(t *testing.T) {
	e := newEnv(t)
	e.createVM("ready-vm", nil, "ready-vm-disk")
	took := e.eventually("VM ready", func() bool { r, p, c := e.vmState("ready-vm"); return r && c && p == "Running" })
	if got := e.vmiPhase("ready-vm"); got != "Running" {
		t.Fatalf("VMI phase = %q, want Running", got)
	}
	vmi, _ := e.get("vmi", "ready-vm")
	ref := metav1.GetControllerOf(vmi)
	vm, _ := e.get("vm", "ready-vm")
	if ref == nil || ref.UID != vm.GetUID() || ref.Kind != "VirtualMachine" {
		t.Fatalf("VMI controller ref = %+v, want the VM %s", ref, vm.GetUID())
	}
	if l := vmi.GetLabels()["labkeep.io/role"]; l != "control" {
		t.Fatalf("VMI did not get the template's labels: %v", vmi.GetLabels())
	}
	dv, err := e.get("dv", "ready-vm-disk")
	if err != nil {
		t.Fatalf("DataVolume from dataVolumeTemplates: %v", err)
	}
	if ref := metav1.GetControllerOf(dv); ref == nil || ref.UID != vm.GetUID() {
		t.Fatalf("DataVolume not owned by the VM: %+v", dv.GetOwnerReferences())
	}
	t.Logf("VM ready %s after create (boot delay 500ms)", took.Round(10*time.Millisecond))
}

// Deleting the VM removes its VMI (through the garbage
// collector) and its DataVolume.
func TestDeletingVMRemovesVMI(t *testing.T) {
	e := newEnv(t)
	e.createVM("doomed", nil, "doomed-disk")
	e.eventually("VM ready", func() bool { r, _, _ := e.vmState("doomed"); return r })
	if err := e.dyn.Resource(virtsim.VirtualMachines).Namespace(e.ns).Delete(context.Background(), "doomed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	took := e.eventually("VMI and DataVolume gone", func() bool {
		_, errVMI := e.get("vmi", "doomed")
		_, errDV := e.get("dv", "doomed-disk")
		return apierrors.IsNotFound(errVMI) && apierrors.IsNotFound(errDV)
	})
	t.Logf("VMI and DataVolume removed %s after the VM delete", took.Round(10*time.Millisecond))
}

// The "VMI vanishes" knob leaves a VM without a VMI, shown not
// ready, and virtsim does not bring the VMI back.
func TestVanishLeavesVMWithoutVMI(t *testing.T) {
	e := newEnv(t)
	e.createVM("lost", nil, "")
	e.eventually("VM ready", func() bool { r, _, _ := e.vmState("lost"); return r })
	if err := st.Sim.Vanish(context.Background(), e.ns, "lost"); err != nil {
		t.Fatal(err)
	}
	e.eventually("VM not ready, VMI gone", func() bool {
		r, p, c := e.vmState("lost")
		return !r && !c && p == "Stopped" && e.vmiPhase("lost") == "<none>"
	})
	time.Sleep(1500 * time.Millisecond) // three boot delays: a recreated VMI would be back
	if _, err := e.get("vmi", "lost"); !apierrors.IsNotFound(err) {
		t.Fatalf("VMI came back after vanishing: %v", err)
	}
	if _, err := e.get("vm", "lost"); err != nil {
		t.Fatalf("the VM itself must stay: %v", err)
	}
}

// The never-ready and boot-delay annotations hold a VM short of ready.
func TestNeverReadyAnnotation(t *testing.T) {
	e := newEnv(t)
	e.createVM("stuck", map[string]string{virtsim.AnnotationNeverReady: "true"}, "")
	e.createVM("slow", map[string]string{virtsim.AnnotationBootDelay: "3s"}, "")
	e.eventually("stuck VMI scheduled", func() bool { return e.vmiPhase("stuck") == "Scheduled" })
	time.Sleep(time.Second)
	if r, p, _ := e.vmState("stuck"); r || p != "Starting" {
		t.Fatalf("never-ready VM: ready=%v printable=%q, want not ready and Starting", r, p)
	}
	if r, _, _ := e.vmState("slow"); r {
		t.Fatal("slow VM ready before its 3s boot delay")
	}
	e.eventually("slow VM ready", func() bool { r, _, _ := e.vmState("slow"); return r })
	if r, _, _ := e.vmState("stuck"); r {
		t.Fatal("never-ready VM became ready")
	}
}

// withoutProbe (a createVM annotation, not sent) builds the VM without a
// readinessProbe.
const withoutProbe = "test/without-probe"

// Ready means the readiness probe passed: a VM whose template has none
// reaches Running but never Ready, while its twin with a probe (the
// control) does become Ready.
func TestVMWithoutReadinessProbeNeverReady(t *testing.T) {
	e := newEnv(t)
	e.createVM("no-probe", map[string]string{withoutProbe: "true"}, "")
	e.createVM("probed", nil, "")
	e.eventually("probed VM ready", func() bool { r, _, _ := e.vmState("probed"); return r })
	// Both were created together with the same boot delay; once the
	// probed one is Ready the other has passed its boot delay too.
	e.eventually("probe-less VMI running", func() bool { return e.vmiPhase("no-probe") == "Running" })
	vmi, err := e.get("vmi", "no-probe")
	if err != nil {
		t.Fatal(err)
	}
	if _, has, _ := unstructured.NestedMap(vmi.Object, "spec", "readinessProbe"); has {
		t.Fatal("the probe-less VM's VMI has a readinessProbe")
	}
	if r, p, _ := e.vmState("no-probe"); r || p == "Running" {
		t.Fatalf("VM without a readinessProbe: ready=%v printable=%q, want not ready", r, p)
	}
}

// A VM that should not run gets no VMI.
func TestHaltedVMGetsNoVMI(t *testing.T) {
	e := newEnv(t)
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
		"metadata": map[string]any{"name": "halted"},
		"spec":     map[string]any{"runStrategy": "Halted", "template": map[string]any{"spec": map[string]any{"domain": map[string]any{"devices": map[string]any{}}}}},
	}}
	if _, err := e.dyn.Resource(virtsim.VirtualMachines).Namespace(e.ns).Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("halted VM shows Stopped", func() bool { _, p, _ := e.vmState("halted"); return p == "Stopped" })
	if got := e.vmiPhase("halted"); got != "<none>" {
		t.Fatalf("halted VM has a VMI in phase %q", got)
	}
}

// Like KubeVirt, every VMI gets one virt-launcher Pod named
// virt-launcher-<vmi>-<5 random>, with the VMI's labels plus
// kubevirt.io=virt-launcher, controlled by the VMI; deleting the VM takes
// it away through the garbage collector.
func TestVMIGetsOneLauncherPod(t *testing.T) {
	e := newEnv(t)
	e.createVM("launched", nil, "")
	e.eventually("VM ready", func() bool { r, _, _ := e.vmState("launched"); return r })
	vmi, err := e.get("vmi", "launched")
	if err != nil {
		t.Fatal(err)
	}
	launchers := func() []unstructured.Unstructured {
		list, err := e.dyn.Resource(virtsim.Pods).Namespace(e.ns).List(context.Background(), metav1.ListOptions{LabelSelector: "kubevirt.io=virt-launcher"})
		if err != nil {
			t.Fatal(err)
		}
		return list.Items
	}
	// The VMI went through three phases (three syncs) by now: still one.
	pods := launchers()
	if len(pods) != 1 {
		t.Fatalf("%d launcher Pods for one VMI, want 1", len(pods))
	}
	pod := pods[0]
	if rest, ok := strings.CutPrefix(pod.GetName(), "virt-launcher-launched-"); !ok || len(rest) != 5 {
		t.Errorf("launcher Pod name %q, want virt-launcher-launched-<5 random>", pod.GetName())
	}
	want := map[string]string{"labkeep.io/role": "control", "kubevirt.io": "virt-launcher",
		"kubevirt.io/created-by": string(vmi.GetUID()), "vm.kubevirt.io/name": "launched"}
	if diff := cmp.Diff(want, pod.GetLabels()); diff != "" {
		t.Errorf("launcher Pod labels (-want +got):\n%s", diff)
	}
	if ref := metav1.GetControllerOf(&pod); ref == nil || ref.UID != vmi.GetUID() || ref.Kind != "VirtualMachineInstance" {
		t.Errorf("launcher Pod controller = %+v, want the VMI %s", ref, vmi.GetUID())
	}
	if err := e.dyn.Resource(virtsim.VirtualMachines).Namespace(e.ns).Delete(context.Background(), "launched", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	took := e.eventually("launcher Pod gone with the VM", func() bool { return len(launchers()) == 0 })
	t.Logf("launcher Pod %s removed by the garbage collector %s after the VM delete", pod.GetName(), took.Round(10*time.Millisecond))
}
