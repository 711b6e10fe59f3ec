// Package virtsim is a dev/test stand-in for KubeVirt's virt-controller. It
// is NOT KubeVirt: no VM ever boots. It only moves the API objects labkeep
// relies on the way virt-controller would, so the session functions and the
// reaper can be exercised against a real API server, garbage collector and
// quota controller without nested virtualisation:
//
//   - a VirtualMachine that should run (runStrategy Always or RerunOnFailure,
//     or running: true) gets a VirtualMachineInstance of the same name,
//     controlled by the VM (ownerReference controller=true), which goes
//     Pending → Scheduled → Running and gets condition Ready=True after the
//     boot delay — only if its spec has a readinessProbe: virtsim cannot
//     probe a guest, so it counts a probe as passing at the boot delay, and
//     a VMI without one reaches Running but never Ready (KubeVirt would
//     call it Ready at boot, before sshd listens; here a VM built without
//     its probe is caught); the VM's status.created, status.ready and
//     status.printableStatus follow;
//   - spec.dataVolumeTemplates produce DataVolumes owned by the VM;
//   - every VMI gets a virt-launcher Pod, as KubeVirt runs each VMI in one:
//     named virt-launcher-<vmi>-<5 random characters> (generateName),
//     labelled with the VMI's labels (so labkeep.io/env and
//     labkeep.io/session too) plus kubevirt.io=virt-launcher,
//     kubevirt.io/created-by=<VMI uid> and vm.kubevirt.io/name=<vmi>, and
//     controlled by the VMI (ownerReference controller=true), so the
//     garbage collector removes it with the VMI. It has one container and
//     never runs (there is no kubelet); a launcher Pod deleted by someone
//     else is not replaced (KubeVirt would fail the VMI; virtsim leaves the
//     VMI as it is);
//   - deleting a VM removes its VMI, and so its launcher Pod, through the
//     garbage collector (the ownerReferences), not through virtsim;
//   - a VM whose VMI disappears shows not ready, and a VM marked lost (the
//     "VMI vanishes" fault) is left without a VMI, as after a node loss.
//
// Faults are chosen per VM by annotations (usable from kubectl while
// `make run` is up) or by Options.Faults (for tests that do not know VM
// names in advance).
package virtsim

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"labkeep/localrun/images"
)

// GVRs of the resources virtsim acts on.
var (
	VirtualMachines         = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachines"}
	VirtualMachineInstances = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}
	DataVolumes             = schema.GroupVersionResource{Group: "cdi.kubevirt.io", Version: "v1beta1", Resource: "datavolumes"}
	Pods                    = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
)

// Annotations on a VirtualMachine that select a fault.
const (
	// AnnotationNeverReady: "true" keeps the VMI Scheduled forever.
	AnnotationNeverReady = "virtsim.labkeep.io/never-ready"
	// AnnotationBootDelay: a Go duration overriding Options.BootDelay.
	AnnotationBootDelay = "virtsim.labkeep.io/boot-delay"
	// AnnotationLost: "true" deletes the VMI and never recreates it.
	AnnotationLost = "virtsim.labkeep.io/lost"
)

// Fault is the simulated misbehaviour of one VM.
type Fault struct {
	NeverReady bool          // the VMI never gets Ready=True
	BootDelay  time.Duration // >0 overrides Options.BootDelay
	Lost       bool          // the VMI vanishes and is not recreated
}

// Options configures a Sim.
type Options struct {
	// Namespace limits the sim to one namespace ("" = all).
	Namespace string
	// BootDelay is the time from VMI creation to Ready (default 2s).
	BootDelay time.Duration
	// Faults, if set, is asked for each VM; its result is merged with the
	// VM's annotations (either can switch a fault on).
	Faults func(vm *kubevirtv1.VirtualMachine) Fault
	// Logger receives one line per state change (nil = slog.Default()).
	Logger *slog.Logger
}

// Sim is a running stand-in controller.
type Sim struct {
	opts    Options
	dyn     dynamic.Interface
	factory dynamicinformer.DynamicSharedInformerFactory
	vms     cache.GenericLister
	vmis    cache.GenericLister
	queue   workqueue.TypedRateLimitingInterface[key]
	log     *slog.Logger

	synced chan struct{} // closed once the informer caches have synced

	mu   sync.Mutex
	lost map[string]bool // ns/name of VMs marked lost through Vanish
	// launched is, by ns/name, the UID of the VMI whose launcher Pod
	// virtsim has created or found, so it is made once per VMI.
	launched map[string]types.UID
}

type key struct {
	kind      string // "vm" or "vmi"
	namespace string
	name      string
}

// New builds a Sim; call Run to start it.
func New(cfg *rest.Config, opts Options) (*Sim, error) {
	if opts.BootDelay == 0 {
		opts.BootDelay = 2 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	s := &Sim{
		opts: opts, dyn: dyn, log: opts.Logger.With("component", "virtsim"),
		factory:  dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 10*time.Minute, opts.Namespace, nil),
		queue:    workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[key](20*time.Millisecond, 2*time.Second)),
		lost:     map[string]bool{},
		launched: map[string]types.UID{},
		synced:   make(chan struct{}),
	}
	vmInf := s.factory.ForResource(VirtualMachines)
	vmiInf := s.factory.ForResource(VirtualMachineInstances)
	s.vms, s.vmis = vmInf.Lister(), vmiInf.Lister()
	enqueue := func(kind string) cache.ResourceEventHandlerFuncs {
		add := func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			u, ok := obj.(*unstructured.Unstructured)
			if !ok {
				return
			}
			s.queue.Add(key{kind, u.GetNamespace(), u.GetName()})
			if kind == "vmi" { // the owning VM's status follows its VMI
				s.queue.Add(key{"vm", u.GetNamespace(), u.GetName()})
			}
		}
		return cache.ResourceEventHandlerFuncs{AddFunc: add, UpdateFunc: func(_, n any) { add(n) }, DeleteFunc: add}
	}
	if _, err := vmInf.Informer().AddEventHandler(enqueue("vm")); err != nil {
		return nil, err
	}
	if _, err := vmiInf.Informer().AddEventHandler(enqueue("vmi")); err != nil {
		return nil, err
	}
	return s, nil
}

// Synced is closed once Run's caches have synced: from then on every VM is
// acted on.
func (s *Sim) Synced() <-chan struct{} { return s.synced }

// Run processes VMs and VMIs until ctx is done, then returns nil once its
// workers have stopped. It returns an error only if the caches could not
// sync while ctx was still live (the CRDs are missing, say).
func (s *Sim) Run(ctx context.Context) error {
	s.factory.Start(ctx.Done())
	for gvr, ok := range s.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			s.factory.Shutdown()
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("virtsim: cache for %s did not sync", gvr.Resource)
		}
	}
	close(s.synced)
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s.processNext(ctx) {
			}
		}()
	}
	<-ctx.Done()
	s.queue.ShutDown()
	wg.Wait()
	s.factory.Shutdown()
	return nil
}

// Vanish simulates a node loss for VM ns/name: its VMI is deleted and is not
// recreated while the VM exists. Returns an error if the VMI could not be
// deleted (a VMI that is already gone is not an error).
func (s *Sim) Vanish(ctx context.Context, ns, name string) error {
	s.mu.Lock()
	s.lost[ns+"/"+name] = true
	s.mu.Unlock()
	err := s.dyn.Resource(VirtualMachineInstances).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	s.queue.Add(key{"vm", ns, name})
	return nil
}

func (s *Sim) processNext(ctx context.Context) bool {
	k, quit := s.queue.Get()
	if quit {
		return false
	}
	defer s.queue.Done(k)
	var (
		requeue time.Duration
		err     error
	)
	if k.kind == "vm" {
		err = s.syncVM(ctx, k.namespace, k.name)
	} else {
		requeue, err = s.syncVMI(ctx, k.namespace, k.name)
	}
	switch {
	case err != nil && ctx.Err() == nil:
		if !apierrors.IsConflict(err) {
			s.log.Warn("sync failed", "kind", k.kind, "namespace", k.namespace, "name", k.name, "err", err)
		}
		s.queue.AddRateLimited(k)
	case requeue > 0:
		s.queue.Forget(k)
		s.queue.AddAfter(k, requeue)
	default:
		s.queue.Forget(k)
	}
	return true
}

func (s *Sim) faultFor(vm *kubevirtv1.VirtualMachine) Fault {
	var f Fault
	if s.opts.Faults != nil {
		f = s.opts.Faults(vm)
	}
	a := vm.Annotations
	f.NeverReady = f.NeverReady || a[AnnotationNeverReady] == "true"
	f.Lost = f.Lost || a[AnnotationLost] == "true"
	if d, err := time.ParseDuration(a[AnnotationBootDelay]); err == nil && d > 0 {
		f.BootDelay = d
	}
	s.mu.Lock()
	f.Lost = f.Lost || s.lost[vm.Namespace+"/"+vm.Name]
	s.mu.Unlock()
	return f
}

func shouldRun(vm *kubevirtv1.VirtualMachine) bool {
	if vm.Spec.RunStrategy != nil {
		rs := *vm.Spec.RunStrategy
		return rs == kubevirtv1.RunStrategyAlways || rs == kubevirtv1.RunStrategyRerunOnFailure
	}
	return vm.Spec.Running != nil && *vm.Spec.Running
}

func (s *Sim) getVM(ns, name string) (*kubevirtv1.VirtualMachine, error) {
	obj, err := s.vms.ByNamespace(ns).Get(name)
	if err != nil {
		return nil, err
	}
	vm := &kubevirtv1.VirtualMachine{}
	return vm, runtime.DefaultUnstructuredConverter.FromUnstructured(obj.(*unstructured.Unstructured).UnstructuredContent(), vm)
}

func (s *Sim) getVMI(ns, name string) (*kubevirtv1.VirtualMachineInstance, error) {
	obj, err := s.vmis.ByNamespace(ns).Get(name)
	if err != nil {
		return nil, err
	}
	vmi := &kubevirtv1.VirtualMachineInstance{}
	return vmi, runtime.DefaultUnstructuredConverter.FromUnstructured(obj.(*unstructured.Unstructured).UnstructuredContent(), vmi)
}

func toUnstructured(obj any) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	return &unstructured.Unstructured{Object: m}, nil
}

func controllerRef(vm *kubevirtv1.VirtualMachine) metav1.OwnerReference {
	t := true
	return metav1.OwnerReference{
		APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: vm.Name, UID: vm.UID,
		Controller: &t, BlockOwnerDeletion: &t,
	}
}

// syncVM creates DataVolumes and the VMI a running VM needs, deletes the VMI
// of a VM that should not run, and mirrors the VMI's state into VM status.
func (s *Sim) syncVM(ctx context.Context, ns, name string) error {
	vm, err := s.getVM(ns, name)
	if apierrors.IsNotFound(err) {
		s.mu.Lock()
		delete(s.lost, ns+"/"+name)
		s.mu.Unlock()
		return nil // the garbage collector removes what the VM owned
	}
	if err != nil {
		return err
	}
	if vm.DeletionTimestamp != nil {
		return nil
	}
	fault := s.faultFor(vm)
	for _, tmpl := range vm.Spec.DataVolumeTemplates {
		if err := s.ensureDataVolume(ctx, vm, tmpl); err != nil {
			return err
		}
	}
	vmi, err := s.getVMI(ns, name)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if apierrors.IsNotFound(err) {
		vmi = nil
	}
	if vmi != nil && !metav1.IsControlledBy(vmi, vm) {
		vmi = nil // someone else's VMI of that name: not ours to drive
	}
	run := shouldRun(vm)
	switch {
	case run && vmi == nil && !fault.Lost:
		vmi = &kubevirtv1.VirtualMachineInstance{
			ObjectMeta: metav1.ObjectMeta{
				Name: vm.Name, Namespace: ns,
				Labels:          vm.Spec.Template.ObjectMeta.Labels,
				Annotations:     vm.Spec.Template.ObjectMeta.Annotations,
				OwnerReferences: []metav1.OwnerReference{controllerRef(vm)},
			},
			Spec: vm.Spec.Template.Spec,
		}
		u, err := toUnstructured(vmi)
		if err != nil {
			return err
		}
		u.SetAPIVersion("kubevirt.io/v1")
		u.SetKind("VirtualMachineInstance")
		unstructured.RemoveNestedField(u.Object, "status")
		if _, err := s.dyn.Resource(VirtualMachineInstances).Namespace(ns).Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		s.log.Info("created VMI", "namespace", ns, "name", name)
		vmi = nil // status follows once the informer sees it
	case fault.Lost && vmi != nil:
		if err := s.dyn.Resource(VirtualMachineInstances).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		vmi = nil
	case !run && vmi != nil && vmi.DeletionTimestamp == nil:
		if err := s.dyn.Resource(VirtualMachineInstances).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return s.updateVMStatus(ctx, vm, vmi, run)
}

func vmiReady(vmi *kubevirtv1.VirtualMachineInstance) bool {
	if vmi == nil || vmi.DeletionTimestamp != nil {
		return false
	}
	for _, c := range vmi.Status.Conditions {
		if c.Type == kubevirtv1.VirtualMachineInstanceReady && c.Status == "True" {
			return true
		}
	}
	return false
}

func (s *Sim) updateVMStatus(ctx context.Context, vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance, run bool) error {
	st := vm.Status
	st.Created = vmi != nil && vmi.DeletionTimestamp == nil
	st.Ready = vmiReady(vmi)
	switch {
	case st.Ready:
		st.PrintableStatus = kubevirtv1.VirtualMachineStatusRunning
	case st.Created:
		st.PrintableStatus = kubevirtv1.VirtualMachineStatusStarting
	case run && !s.faultFor(vm).Lost:
		st.PrintableStatus = kubevirtv1.VirtualMachineStatusProvisioning
	default:
		st.PrintableStatus = kubevirtv1.VirtualMachineStatusStopped
	}
	readyStatus := "False"
	if st.Ready {
		readyStatus = "True"
	}
	st.Conditions = []kubevirtv1.VirtualMachineCondition{{
		Type: kubevirtv1.VirtualMachineReady, Status: corev1.ConditionStatus(readyStatus),
		LastTransitionTime: conditionTime(vm.Status.Conditions, readyStatus),
	}}
	if st.Created == vm.Status.Created && st.Ready == vm.Status.Ready && st.PrintableStatus == vm.Status.PrintableStatus {
		return nil
	}
	vm.Status = st
	u, err := toUnstructured(vm)
	if err != nil {
		return err
	}
	if _, err := s.dyn.Resource(VirtualMachines).Namespace(vm.Namespace).UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	s.log.Info("VM status", "namespace", vm.Namespace, "name", vm.Name, "printableStatus", st.PrintableStatus, "ready", st.Ready)
	return nil
}

// syncVMI advances a VMI's phase by the time since its creation and returns
// when it should be looked at again.
func (s *Sim) syncVMI(ctx context.Context, ns, name string) (time.Duration, error) {
	vmi, err := s.getVMI(ns, name)
	if apierrors.IsNotFound(err) {
		s.mu.Lock()
		delete(s.launched, ns+"/"+name)
		s.mu.Unlock()
		return 0, nil // the garbage collector removes its launcher Pod
	}
	if err != nil {
		return 0, err
	}
	if vmi.DeletionTimestamp != nil {
		return 0, nil
	}
	if err := s.ensureLauncher(ctx, vmi); err != nil {
		return 0, err
	}
	var fault Fault
	delay := s.opts.BootDelay
	if ref := metav1.GetControllerOf(vmi); ref != nil && ref.Kind == "VirtualMachine" {
		if vm, err := s.getVM(ns, ref.Name); err == nil {
			fault = s.faultFor(vm)
		}
	}
	if fault.BootDelay > 0 {
		delay = fault.BootDelay
	}
	age := time.Since(vmi.CreationTimestamp.Time)
	phase, ready, next := kubevirtv1.Pending, false, delay/2-age
	switch {
	case age >= delay && !fault.NeverReady:
		phase, ready, next = kubevirtv1.Running, vmi.Spec.ReadinessProbe != nil, 0
	case age >= delay/2:
		phase, next = kubevirtv1.Scheduled, delay-age
		if fault.NeverReady {
			next = 0
		}
	}
	if vmi.Status.Phase == phase && vmiReady(vmi) == ready {
		return next, nil
	}
	vmi.Status.Phase = phase
	vmi.Status.NodeName = "virtsim-node"
	if ready {
		vmi.Status.Conditions = []kubevirtv1.VirtualMachineInstanceCondition{{
			Type: kubevirtv1.VirtualMachineInstanceReady, Status: "True", LastTransitionTime: metav1.Now(),
		}}
		vmi.Status.Interfaces = []kubevirtv1.VirtualMachineInstanceNetworkInterface{{Name: "default", IP: "10.0.2.2"}}
	}
	u, err := toUnstructured(vmi)
	if err != nil {
		return 0, err
	}
	if _, err := s.dyn.Resource(VirtualMachineInstances).Namespace(ns).UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return 0, nil
		}
		return 0, err
	}
	s.log.Info("VMI phase", "namespace", ns, "name", name, "phase", phase, "ready", ready, "after", age.Round(time.Millisecond).String())
	return next, nil
}

// Labels KubeVirt puts on a virt-launcher Pod besides the VMI's own.
const (
	LabelLauncher      = kubevirtv1.AppLabel // value "virt-launcher"
	LauncherLabelValue = "virt-launcher"
)

// ensureLauncher creates the VMI's virt-launcher Pod unless it exists: once
// per VMI (found by its kubevirt.io/created-by label, so a restarted Sim
// does not make a second one).
func (s *Sim) ensureLauncher(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance) error {
	k := vmi.Namespace + "/" + vmi.Name
	s.mu.Lock()
	done := s.launched[k] == vmi.UID
	s.mu.Unlock()
	if done {
		return nil
	}
	existing, err := s.dyn.Resource(Pods).Namespace(vmi.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: kubevirtv1.CreatedByLabel + "=" + string(vmi.UID),
	})
	if err != nil {
		return err
	}
	if len(existing.Items) == 0 {
		labels := map[string]string{}
		for name, value := range vmi.Labels {
			labels[name] = value
		}
		labels[LabelLauncher] = LauncherLabelValue
		labels[kubevirtv1.CreatedByLabel] = string(vmi.UID)
		labels[kubevirtv1.DeprecatedVirtualMachineNameLabel] = vmi.Name
		t, f := true, false
		pod := &corev1.Pod{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{
				GenerateName: "virt-launcher-" + vmi.Name + "-",
				Namespace:    vmi.Namespace,
				Labels:       labels,
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance", Name: vmi.Name, UID: vmi.UID,
					Controller: &t, BlockOwnerDeletion: &t,
				}},
			},
			Spec: corev1.PodSpec{
				AutomountServiceAccountToken: &f,
				RestartPolicy:                corev1.RestartPolicyNever,
				Containers:                   []corev1.Container{{Name: "compute", Image: images.VirtLauncher, ImagePullPolicy: corev1.PullIfNotPresent}},
			},
		}
		u, err := toUnstructured(pod)
		if err != nil {
			return err
		}
		unstructured.RemoveNestedField(u.Object, "status")
		created, err := s.dyn.Resource(Pods).Namespace(vmi.Namespace).Create(ctx, u, metav1.CreateOptions{})
		if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
			return nil // the VMI goes with its namespace
		}
		if err != nil {
			return err
		}
		s.log.Info("created launcher Pod", "namespace", vmi.Namespace, "name", created.GetName(), "vmi", vmi.Name)
	}
	s.mu.Lock()
	s.launched[k] = vmi.UID
	s.mu.Unlock()
	return nil
}

func (s *Sim) ensureDataVolume(ctx context.Context, vm *kubevirtv1.VirtualMachine, tmpl kubevirtv1.DataVolumeTemplateSpec) error {
	if tmpl.Name == "" {
		return nil
	}
	_, err := s.dyn.Resource(DataVolumes).Namespace(vm.Namespace).Get(ctx, tmpl.Name, metav1.GetOptions{})
	if err == nil || !apierrors.IsNotFound(err) {
		return err
	}
	spec, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&tmpl.Spec)
	if err != nil {
		return err
	}
	dv := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
		"spec": spec,
	}}
	dv.SetName(tmpl.Name)
	dv.SetNamespace(vm.Namespace)
	dv.SetLabels(tmpl.Labels)
	dv.SetOwnerReferences([]metav1.OwnerReference{controllerRef(vm)})
	created, err := s.dyn.Resource(DataVolumes).Namespace(vm.Namespace).Create(ctx, dv, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		return err
	}
	_ = unstructured.SetNestedField(created.Object, "Succeeded", "status", "phase")
	_ = unstructured.SetNestedField(created.Object, "100.0%", "status", "progress")
	if _, err := s.dyn.Resource(DataVolumes).Namespace(vm.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	s.log.Info("created DataVolume", "namespace", vm.Namespace, "name", tmpl.Name, "vm", vm.Name)
	return nil
}

func conditionTime(conds []kubevirtv1.VirtualMachineCondition, status string) metav1.Time {
	for _, c := range conds {
		if c.Type == kubevirtv1.VirtualMachineReady && string(c.Status) == status {
			return c.LastTransitionTime
		}
	}
	return metav1.Now()
}
