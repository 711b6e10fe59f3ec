package session_test

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"labkeep/infra"
	"labkeep/localrun/devserve"
	"labkeep/localrun/stacktest"
	"labkeep/shared/access"
)

// `make run` serves the functions on the local stack with the sample labs,
// LABKEEP_* settings applied, as the infra ServiceAccount, and the printed
// tokens work (they carry the aud and iss it requires).
func TestMakeRunServesTheFunctions(t *testing.T) {
	var out bytes.Buffer
	srv := stacktest.MakeRun(t, st, map[string]string{
		"LABKEEP_MAX_CONCURRENT_VMS": "3", "LABKEEP_SESSION_LIFETIME": "2m", "LABKEEP_SESSION_MAX_LIFETIME": "5m",
	}, &out)
	ns := srv.App.Config.Kube.Namespace
	t.Logf("printed:\n%s", out.String())
	for _, want := range []string{srv.URL, srv.StudentToken, srv.InstructorToken, srv.AdminToken, "k8s-cluster linux-vm shell", "max 3 VMs"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	c := stacktest.NewClient(t, srv.URL)
	// The printed instructor token reads the reservations and books only
	// its own course.
	if r := c.Do("GET", "/adminReservations", srv.InstructorToken, "", ""); r.Status != http.StatusOK {
		t.Errorf("the instructor token's reservations = %d %s", r.Status, r.Body)
	}
	other := `{"course":"math-7","lab":"shell","seats":1,"start":"` + time.Now().Add(24*time.Hour).UTC().Format(time.RFC3339) + `","end":"` + time.Now().Add(25*time.Hour).UTC().Format(time.RFC3339) + `"}`
	if r := c.Do("POST", "/adminReserve", srv.InstructorToken, other, "application/json"); r.Status != http.StatusForbidden || !strings.Contains(r.Message, "("+devserve.SampleCourse+")") {
		t.Errorf("the instructor token booking another course = %d %s; want 403 naming %s", r.Status, r.Body, devserve.SampleCourse)
	}
	// aud and iss are required, as every shipped template requires them:
	// a token without them is refused.
	bare, err := access.Sign([]byte(srv.App.Config.JWTSecret), devserve.SampleStudent, access.RoleStudent, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if r := c.Do("GET", "/getSession", bare, "", ""); r.Status != http.StatusUnauthorized || !strings.Contains(r.Message, "aud claim is required") {
		t.Errorf("a token without aud and iss = %d %s, want 401 naming the missing aud", r.Status, r.Body)
	}
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
	runPrintedLines(t, out.String())
	if r := c.Do("POST", "/closeSession", srv.StudentToken, "", ""); r.Status != 200 {
		t.Errorf("close the pasted lines' session = %d %s", r.Status, r.Body)
	}
}

// runPrintedLines runs, in bash, what `make run` tells its reader to
// paste — the "source" line, then every curl line — with curl made to fail
// on an HTTP error, so a line that answers 401 (an unset $TOKEN) fails.
func runPrintedLines(t *testing.T, printed string) {
	t.Helper()
	script := []string{"set -euo pipefail", `curl() { command curl --fail-with-body "$@"; echo; }`}
	for _, line := range strings.Split(printed, "\n") {
		for _, cmd := range []string{"source ", "curl "} {
			i := strings.Index(line, cmd)
			if i < 0 {
				continue
			}
			if label := strings.TrimSpace(line[:i]); label == "" || strings.HasSuffix(label, ":") {
				script = append(script, line[i:])
				break
			}
		}
	}
	if len(script) < 2+5 || !strings.HasPrefix(script[2], "source ") {
		t.Fatalf("printed lines: want a source line first and curl lines, got %q", script[2:])
	}
	for _, k := range []string{"TOKEN", "ADMIN_TOKEN", "LABKEEP_URL", "LABKEEP_ADMIN_TOKEN", "METRICS_TOKEN"} {
		os.Unsetenv(k) // only the env file may set them
	}
	cmd := exec.Command("bash", "-c", strings.Join(script, "\n"))
	b, err := cmd.CombinedOutput()
	t.Logf("pasted:\n%s\nanswered:\n%s", strings.Join(script[2:], "\n"), b)
	if err != nil {
		t.Fatalf("the printed lines failed when pasted: %v", err)
	}
}
