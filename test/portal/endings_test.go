package portal_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"labkeep/localrun/browser"
	"labkeep/localrun/stacktest"
	"labkeep/shared/httpapi"
	"labkeep/shared/session"
)

// What a student reads when a lab cannot open or ends on its own is the
// server's sentence (shared/httpapi/errors.go, shared/session/end.go),
// shown by the page as sent: no capacity (with when to retry, Open held
// until then), the time limit, a lab that broke (ghost), and a cluster
// that refused to create it. VM labs on virtsim, the KubeVirt stand-in:
// no VM boots, the functions, reaper and database are real.
func TestPageShowsTheServersReasons(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{MaxVMs: 1, CapacityWait: time.Second})
	s := visit(t, browser.Start(t, browser.Isolated), d, "ann")
	s.waitPage("the lab list", 30*time.Second, func(p pageState) bool { return p.Labs })

	// No capacity: bob holds the only VM.
	d.Opened("bob", "linux-vm")
	s.openLab("linux-vm")
	p := s.waitPage("no capacity", time.Minute, func(p pageState) bool { return p.MessageCode == "no_capacity" })
	s.tab.Screenshot("no-capacity")
	retry := int(httpapi.DefaultRetryAfter / time.Second)
	if want := fmt.Sprintf("%s (try again in %d s)", session.Sentence(session.EndNoCapacity), retry); p.Message != want {
		t.Errorf("message %q, want %q", p.Message, want)
	}
	if !p.Open.Disabled || !strings.Contains(p.Open.Note, "you can try again in") {
		t.Errorf("open form %+v: want Open held until Retry-After", p.Open)
	}
	if r := d.Close("bob"); r.Status != http.StatusOK {
		t.Fatalf("bob's close = %d %s", r.Status, r.Body)
	}

	// The time limit: past it the page says so at once, and after the
	// reaper has run it reads the server's sentence.
	s.reload()
	s.openLab("linux-vm")
	s.waitPage("the lab running", time.Minute, func(p pageState) bool { return p.Status == "running" })
	d.Clock.Advance(time.Duration(s.get().RemainingSeconds+1) * time.Second)
	s.waitPage("the lab expired", time.Minute, func(p pageState) bool { return p.Status == "expired" && p.Message != "" })
	s.tab.Screenshot("expired")
	s.reapTick()
	s.reload()
	p = s.waitPage("the expired lab's reason", time.Minute, func(p pageState) bool { return p.Status == "expired" && p.Labs })
	if want := session.Sentence(session.EndExpired); p.Message != want {
		t.Errorf("message %q, want %q", p.Message, want)
	}

	// A ghost: the lab's VM is deleted behind labkeep's back; the reaper
	// ends the session and the page, still polling, says why.
	s.openLab("linux-vm")
	s.waitPage("the lab running", time.Minute, func(p pageState) bool { return p.Status == "running" })
	vms := d.Dyn.Resource(stacktest.Resource("VirtualMachine")).Namespace(d.Namespace)
	list, err := vms.List(context.Background(), metav1.ListOptions{LabelSelector: "labkeep.io/session=" + s.get().ID})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("the session's VMs: %v %v", list, err)
	}
	if err := vms.Delete(context.Background(), list.Items[0].GetName(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.reapTick()
	p = s.waitPage("the ghost's reason", time.Minute, func(p pageState) bool { return p.Status == "failed" })
	s.tab.Screenshot("ghost")
	if want := session.Sentence(session.EndGhost); p.Message != want {
		t.Errorf("message %q, want %q", p.Message, want)
	}

	// The cluster refuses the lab's VM: provisioning failed.
	probe := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": map[string]any{"name": "probe"},
		"spec": map[string]any{"runStrategy": "Halted", "template": map[string]any{"spec": map[string]any{"domain": map[string]any{"devices": map[string]any{}}}}},
	}}
	stacktest.Refuse(t, st, stacktest.Refusal{
		Name: "portal-refuse-" + d.Env, Namespace: d.Namespace,
		Group: "kubevirt.io", Resource: "virtualmachines", Operations: []admissionv1.OperationType{admissionv1.Create},
		Expression: "false", Message: "injected fault: no VMs",
		Probe: func() error {
			_, err := vms.Create(context.Background(), probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		},
	})
	s.openLab("linux-vm")
	p = s.waitPage("provisioning failed", time.Minute, func(p pageState) bool { return p.MessageCode == "provisioning_failed" })
	s.tab.Screenshot("provisioning-failed")
	if want := session.Sentence(session.EndProvisioningFailed); p.Message != want || strings.Contains(p.Message, "injected") {
		t.Errorf("message %q, want %q", p.Message, want)
	}
	if !p.Labs || p.Open.Disabled {
		t.Errorf("after a failed open: lab list %v, Open disabled %v; want the student free to retry", p.Labs, p.Open.Disabled)
	}
}

// openLab chooses lab and presses Open.
func (s *student) openLab(lab string) {
	s.t.Helper()
	s.tab.Do(30*time.Second,
		chromedp.WaitVisible(chromedp.CSS("#labs")),
		chromedp.Click(chromedp.CSS(`input[name="lab"][value="`+lab+`"]`)),
		chromedp.WaitEnabled(chromedp.CSS("#open")),
		chromedp.Click(chromedp.CSS("#open")))
}

// reload reloads the page, as a student pressing F5: the token stays in
// the tab's sessionStorage.
func (s *student) reload() {
	s.t.Helper()
	s.tab.Do(30*time.Second, chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#who")))
}

// reapTick runs the reaper as the scheduler does.
func (s *student) reapTick() {
	s.t.Helper()
	if r := s.d.Do("POST", "/reapTick", stacktest.SchedulerToken, "", ""); r.Status != http.StatusOK {
		s.t.Fatalf("reapTick = %d %s", r.Status, r.Body)
	}
}

// A lab of several machines lists each with its own state and SSH
// command, and the known_hosts lines of all (k8s-cluster: three VMs on
// virtsim).
func TestEachMachineHasItsRow(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{})
	s := visit(t, browser.Start(t, browser.Isolated), d, "cid")
	s.openLab("k8s-cluster")
	p := s.waitPage("the cluster running", 2*time.Minute, func(p pageState) bool { return p.Status == "running" })
	s.tab.Screenshot("cluster")
	api := s.get()
	if len(p.Nodes) != len(api.Nodes) || len(p.SSH) != len(api.Nodes) {
		t.Fatalf("page rows %+v, ssh %q; server nodes %+v", p.Nodes, p.SSH, api.Nodes)
	}
	var lines []string
	for i, n := range api.Nodes {
		if p.Nodes[i].Name != n.Name || p.Nodes[i].Phase != n.Phase || n.Phase != "ready" {
			t.Errorf("row %d: page %+v, server %s %s", i, p.Nodes[i], n.Name, n.Phase)
		}
		if want := fmt.Sprintf("root@%s -p %d", n.SSH.Host, n.SSH.Port); !strings.HasSuffix(p.SSH[i], want) {
			t.Errorf("row %d: ssh %q, want it to end %q", i, p.SSH[i], want)
		}
		lines = append(lines, n.SSH.KnownHosts)
	}
	if got := strings.Split(strings.TrimSpace(p.KnownHosts), "\n"); !slices.Equal(got, lines) {
		t.Errorf("known_hosts on the page %q, server %q", got, lines)
	}
	if r := d.Close("cid"); r.Status != http.StatusOK {
		t.Errorf("close = %d %s", r.Status, r.Body)
	}
	d.WaitGone(api.ID)
}
