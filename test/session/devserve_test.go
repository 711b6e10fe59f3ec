package session_test

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"labkeep/infra"
	"labkeep/localrun/devserve"
	"labkeep/localrun/stacktest"
)

// `make run` serves the functions on the local stack with the sample labs,
// LABKEEP_* settings applied, as the infra ServiceAccount, and the printed
// tokens work.
func TestMakeRunServesTheFunctions(t *testing.T) {
	for _, k := range []string{"LABKEEP_ENV", "LABKEEP_DATABASE_URL", "LABKEEP_JWT_SECRET", "LABKEEP_LABS_FILE", "LABKEEP_KUBECONFIG", "LABKEEP_SCHEDULER_TOKEN"} {
		t.Setenv(k, "")
		os.Unsetenv(k) // Start fills these with local defaults
	}
	ns := "devserve-" + stacktest.Suffix()
	t.Setenv("LABKEEP_NAMESPACE", ns)
	t.Setenv("LABKEEP_HTTP_ADDR", "127.0.0.1:0")
	t.Setenv("LABKEEP_MAX_CONCURRENT_VMS", "3")
	t.Setenv("LABKEEP_SESSION_LIFETIME", "2m")
	t.Setenv("LABKEEP_SESSION_MAX_LIFETIME", "5m")
	var out bytes.Buffer
	srv, err := devserve.Start(context.Background(), st, t.TempDir(), stacktest.Discard(), &out)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	t.Logf("printed:\n%s", out.String())
	for _, want := range []string{srv.URL, srv.StudentToken, srv.AdminToken, "k8s-cluster linux-vm shell", "max 3 VMs"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	c := stacktest.NewClient(t, srv.URL)
	r := c.Do("POST", "/openSession", srv.StudentToken, `{"lab":"linux-vm"}`, "")
	if r.Status != 201 || r.Session.Student != devserve.SampleStudent {
		t.Fatalf("open = %d %s", r.Status, r.Body)
	}
	if got := r.Session.ExpiresAt.Sub(r.Session.StartedAt); got != 2*time.Minute {
		t.Errorf("lifetime = %s, want LABKEEP_SESSION_LIFETIME 2m", got)
	}
	if r := c.Do("GET", "/getSession?student="+devserve.SampleStudent, srv.AdminToken, "", ""); r.Status != 200 || r.Session.Lab != "linux-vm" {
		t.Errorf("admin get = %d %s", r.Status, r.Body)
	}
	cs, _ := kubernetes.NewForConfig(st.Admin())
	q, err := cs.CoreV1().ResourceQuotas(ns).Get(context.Background(), infra.VMQuota, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := q.Spec.Hard["count/virtualmachines.kubevirt.io"]; got.String() != "3" {
		t.Errorf("quota = %s, want 3 like LABKEEP_MAX_CONCURRENT_VMS", got.String())
	}
	if r := c.Do("POST", "/closeSession", srv.StudentToken, "", ""); r.Status != 200 {
		t.Errorf("close = %d %s", r.Status, r.Body)
	}
}
