package session_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"labkeep/localrun/stacktest"
)

// A lab whose disk is a golden PVC gets one DataVolume per VM through
// dataVolumeTemplates, owned by the VM, and closing removes it too.
func TestGoldenPVCLabClonesThroughDataVolumeTemplates(t *testing.T) {
	e := newEnv(t, stacktest.Options{LabsYAML: `labs:
- name: golden
  kind: vm
  nodes: [{role: vm, memory: 2Gi}]
  disk: {goldenPVC: {name: ubuntu-golden, namespace: labkeep-golden, size: 20Gi}}
`})
	s := e.Opened("gina", "golden")
	e.WaitRunning("gina", 30*time.Second)
	vmName := "lk-" + s.ID + "-vm"
	var dv interface {
		GetOwnerReferences() []metav1.OwnerReference
	}
	stacktest.Eventually(t, 10*time.Second, func() (bool, string) {
		got, err := e.Dyn.Resource(stacktest.Resource("DataVolume")).Namespace(e.Namespace).Get(context.Background(), vmName+"-root", metav1.GetOptions{})
		if err == nil {
			dv = got
		}
		return err == nil, fmt.Sprintf("DataVolume %s-root: %v", vmName, err)
	})
	if refs := dv.GetOwnerReferences(); len(refs) != 1 || refs[0].Name != vmName {
		t.Errorf("DataVolume owners = %+v, want the VM %s", refs, vmName)
	}
	if c := e.Close("gina"); c.Status != 200 {
		t.Fatalf("close = %d %s", c.Status, c.Body)
	}
	e.WaitNoObjects()
}

// BenchmarkOpenClose measures one student's openSession + closeSession
// round trip over HTTP against the real stack (1-node VM lab), as the
// infra ServiceAccount.
func BenchmarkOpenClose(b *testing.B) {
	e := newEnv(b, stacktest.Options{MaxVMs: 1000})
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		student := fmt.Sprintf("bench-%d", i)
		e.Opened(student, "linux-vm")
		if r := e.Close(student); r.Status != 200 {
			b.Fatalf("close = %d %s", r.Status, r.Body)
		}
	}
}

// BenchmarkOpenToRunning measures openSession until getSession reports
// running (virtsim boot delay included), polling every 10ms.
func BenchmarkOpenToRunning(b *testing.B) {
	e := newEnv(b, stacktest.Options{MaxVMs: 1000})
	for i := 0; b.Loop(); i++ {
		student := fmt.Sprintf("bench-%d", i)
		e.Opened(student, "linux-vm")
		tok := e.Token(student, "student")
		for {
			if g := e.Do("GET", "/getSession", tok, "", ""); g.Session.Status == "running" {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		b.StopTimer()
		e.Do("POST", "/closeSession", tok, "", "")
		b.StartTimer()
	}
}
