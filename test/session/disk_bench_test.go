package session_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A lab whose disk is a golden PVC gets one DataVolume per VM through
// dataVolumeTemplates, owned by the VM, and closing removes it too.
func TestGoldenPVCLabClonesThroughDataVolumeTemplates(t *testing.T) {
	e := newEnv(t, envOptions{labsYAML: `labs:
- name: golden
  kind: vm
  nodes: [{role: vm, memory: 2Gi}]
  disk: {goldenPVC: {name: ubuntu-golden, namespace: labkeep-golden, size: 20Gi}}
`})
	r := e.open("gina", "golden")
	if r.status != 201 {
		t.Fatalf("open = %d %s", r.status, r.body)
	}
	e.waitRunning("gina", 30*time.Second)
	vmName := "lk-" + r.session.ID + "-vm"
	var dv interface {
		GetOwnerReferences() []metav1.OwnerReference
	}
	waitFor(t, 10*time.Second, "DataVolume", func() bool {
		got, err := e.dyn.Resource(gvrDV).Namespace(e.ns).Get(context.Background(), vmName+"-root", metav1.GetOptions{})
		if err == nil {
			dv = got
		}
		return err == nil
	})
	if refs := dv.GetOwnerReferences(); len(refs) != 1 || refs[0].Name != vmName {
		t.Errorf("DataVolume owners = %+v, want the VM %s", refs, vmName)
	}
	if c := e.do("POST", "/closeSession", e.token("gina", "student"), "", ""); c.status != 200 {
		t.Fatalf("close = %d %s", c.status, c.body)
	}
	e.waitNoObjects(20 * time.Second)
}

// BenchmarkOpenClose measures one student's openSession + closeSession
// round trip over HTTP against the real stack (1-node VM lab), as the
// infra ServiceAccount.
func BenchmarkOpenClose(b *testing.B) {
	e := newEnv(b, envOptions{maxVMs: 1000})
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		student := fmt.Sprintf("bench-%d", i)
		if r := e.open(student, "linux-vm"); r.status != 201 {
			b.Fatalf("open = %d %s", r.status, r.body)
		}
		if r := e.do("POST", "/closeSession", e.token(student, "student"), "", ""); r.status != 200 {
			b.Fatalf("close = %d %s", r.status, r.body)
		}
	}
}

// BenchmarkOpenToRunning measures openSession until getSession reports
// running (virtsim boot delay included), polling every 10ms.
func BenchmarkOpenToRunning(b *testing.B) {
	e := newEnv(b, envOptions{maxVMs: 1000})
	for i := 0; b.Loop(); i++ {
		student := fmt.Sprintf("bench-%d", i)
		if r := e.open(student, "linux-vm"); r.status != 201 {
			b.Fatalf("open = %d %s", r.status, r.body)
		}
		tok := e.token(student, "student")
		for {
			if g := e.do("GET", "/getSession", tok, "", ""); g.session.Status == "running" {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		b.StopTimer()
		e.do("POST", "/closeSession", tok, "", "")
		b.StartTimer()
	}
}
