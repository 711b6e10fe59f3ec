package session_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"labkeep/functions/devserve"
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
	call := func(method, path, token, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		var m map[string]any
		json.Unmarshal(b, &m)
		return res.StatusCode, m
	}
	code, s := call("POST", "/openSession", srv.StudentToken, `{"lab":"linux-vm"}`)
	if code != 201 || s["student"] != devserve.SampleStudent {
		t.Fatalf("open = %d %v", code, s)
	}
	start, _ := time.Parse(time.RFC3339Nano, s["startedAt"].(string))
	expires, _ := time.Parse(time.RFC3339Nano, s["expiresAt"].(string))
	if expires.Sub(start) != 2*time.Minute {
		t.Errorf("lifetime = %s, want LABKEEP_SESSION_LIFETIME 2m", expires.Sub(start))
	}
	if code, s := call("GET", "/getSession?student="+devserve.SampleStudent, srv.AdminToken, ""); code != 200 || s["lab"] != "linux-vm" {
		t.Errorf("admin get = %d %v", code, s)
	}
	cs, _ := kubernetes.NewForConfig(st.Admin())
	q, err := cs.CoreV1().ResourceQuotas(ns).Get(context.Background(), "labkeep-vms", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := q.Spec.Hard["count/virtualmachines.kubevirt.io"]; got.String() != "3" {
		t.Errorf("quota = %s, want 3 like LABKEEP_MAX_CONCURRENT_VMS", got.String())
	}
	if code, _ := call("POST", "/closeSession", srv.StudentToken, ""); code != 200 {
		t.Errorf("close = %d", code)
	}
}
