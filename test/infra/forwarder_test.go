package infra_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"

	"labkeep/localrun/controlplane"
	"labkeep/localrun/stacktest"
	"labkeep/shared/httpapi"
	"labkeep/shared/reap"
)

// forwardedCall is what the stand-in for the functions received.
type forwardedCall struct {
	Method, Path string
	Auth         []string
	Body         string
}

// The PingSource's forwarder, run for real: the manifest's nginx template
// rendered by envsubst as the nginx image does at start, served by a real
// nginx, in front of the functions' real reapTick handler (with a
// stand-in reaper). Only the upstream address and the listen port are
// rewritten to loopback.
func TestReapForwarderAddsTheSchedulerToken(t *testing.T) {
	nginx := os.Getenv("LABKEEP_NGINX")
	if nginx == "" {
		var err error
		if nginx, err = exec.LookPath("nginx"); err != nil {
			t.Skip("nginx not found (PATH, or LABKEEP_NGINX); the forwarder's config is only checked statically:", err)
		}
	}
	envsubst, err := exec.LookPath("envsubst")
	if err != nil {
		t.Skip("envsubst (gettext-base) not found; cannot render the template as the nginx image does:", err)
	}
	const token = "0123456789abcdef0123456789abcdef"

	// The functions' real HTTP layer (scheduler-token check, routing,
	// error mapping) over a stand-in reaper, behind a recorder.
	reaper := &recordingReaper{}
	functions := httpapi.New(httpapi.Options{}).WithReaper(httpapi.ReaperOptions{Reaper: reaper, SchedulerToken: token})
	var (
		mu    sync.Mutex
		calls []forwardedCall
	)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		calls = append(calls, forwardedCall{r.Method, r.URL.Path, r.Header.Values("Authorization"), string(body)})
		mu.Unlock()
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		functions.ServeHTTP(w, r)
	}))
	defer upstream.Close()

	// Control: without the forwarder, the functions refuse the tick.
	resp, err := http.Post(upstream.URL+"/reapTick", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || reaper.runs.Load() != 0 {
		t.Fatalf("a tick without the token got %d and ran the reaper %d times; want 401 and no run", resp.StatusCode, reaper.runs.Load())
	}

	var dep appsv1.Deployment
	typed(t, find(t, "reap-pingsource.yaml", "Deployment", ""), &dep)
	ksvc := find(t, "knative-service.yaml", "Service", "")
	rendered := renderTemplate(t, envsubst, forwarderTemplate(t, dep), dep, token)
	port := freePort(t)
	for old, repl := range map[string]string{
		"listen 8080;": fmt.Sprintf("listen 127.0.0.1:%d;", port),
		fmt.Sprintf("proxy_pass http://%s.%s.svc.cluster.local;", ksvc.GetName(), ksvc.GetNamespace()): "proxy_pass " + upstream.URL + ";",
	} {
		if !strings.Contains(rendered, old) {
			t.Fatalf("rendered config lacks %q:\n%s", old, rendered)
		}
		rendered = strings.Replace(rendered, old, repl, 1)
	}
	base := startNginx(t, nginx, rendered, port)

	tests := []struct {
		name       string
		method     string
		path       string
		header     map[string]string
		body       string
		busy       bool // the reaper's lock is held elsewhere
		wantStatus int
		want       []forwardedCall // calls reaching the functions; each runs the reaper
	}{
		{name: "a PingSource tick is posted to reapTick with the token",
			method: "POST", path: "/reapTick",
			header:     map[string]string{"Ce-Specversion": "1.0", "Ce-Type": "dev.knative.sources.ping", "Ce-Source": "/apis/v1/namespaces/labkeep/pingsources/labkeep-reap-tick", "Ce-Id": "1"},
			wantStatus: 200,
			want:       []forwardedCall{{"POST", "/reapTick", []string{"Bearer " + token}, ""}}},
		{name: "the payload is passed on untouched",
			method: "POST", path: "/reapTick", header: map[string]string{"Content-Type": "application/json"}, body: `{"x":1}`,
			wantStatus: 200,
			want:       []forwardedCall{{"POST", "/reapTick", []string{"Bearer " + token}, `{"x":1}`}}},
		{name: "a caller's own Authorization is replaced, never added to",
			method: "POST", path: "/reapTick", header: map[string]string{"Authorization": "Bearer forged"},
			wantStatus: 200,
			want:       []forwardedCall{{"POST", "/reapTick", []string{"Bearer " + token}, ""}}},
		{name: "the reaper's answer reaches the caller (skipped: another run is going)",
			method: "POST", path: "/reapTick", busy: true, wantStatus: 200,
			want: []forwardedCall{{"POST", "/reapTick", []string{"Bearer " + token}, ""}}},
		{name: "GET is refused", method: "GET", path: "/reapTick", wantStatus: 403},
		{name: "admin endpoints are not reachable", method: "POST", path: "/adminReapNow", wantStatus: 404},
		{name: "session endpoints are not reachable", method: "POST", path: "/openSession", wantStatus: 404},
		{name: "sub-paths are not reachable", method: "POST", path: "/reapTick/x", wantStatus: 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mu.Lock()
			calls = nil
			mu.Unlock()
			reaper.busy.Store(tt.busy)
			reaper.runs.Store(0)
			req, err := http.NewRequest(tt.method, base+tt.path, strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tt.header {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.wantStatus {
				t.Errorf("status %d, want %d", resp.StatusCode, tt.wantStatus)
			}
			mu.Lock()
			defer mu.Unlock()
			if diff := cmp.Diff(tt.want, calls); diff != "" {
				t.Errorf("calls reaching the functions (-want +got):\n%s", diff)
			}
			if got := reaper.runs.Load(); got != int64(len(tt.want)) {
				t.Errorf("reaper ran %d times, want %d", got, len(tt.want))
			}
		})
	}
}

// recordingReaper stands in for the reaper behind the real reapTick
// handler: it counts scheduled runs and can report the lock as busy.
type recordingReaper struct {
	runs atomic.Int64
	busy atomic.Bool
}

func (r *recordingReaper) RunOnce(_ context.Context, trigger reap.Trigger) (reap.Report, error) {
	if trigger != reap.TriggerSchedule {
		return reap.Report{}, fmt.Errorf("trigger %q, want the schedule's", trigger)
	}
	r.runs.Add(1)
	if r.busy.Load() {
		return reap.Report{}, reap.ErrBusy
	}
	return reap.Report{ID: 1, Trigger: trigger}, nil
}

var _ httpapi.ReaperRunner = (*recordingReaper)(nil)

// renderTemplate runs envsubst over tmpl the way the nginx image's
// 20-envsubst-on-templates.sh does: only variables defined in the
// container's environment are substituted, so nginx's own $variables
// survive.
func renderTemplate(t *testing.T, envsubst, tmpl string, dep appsv1.Deployment, token string) string {
	t.Helper()
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=/"}
	for _, e := range dep.Spec.Template.Spec.Containers[0].Env {
		switch {
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+e.Value)
		case e.Name == "LABKEEP_SCHEDULER_TOKEN" && e.ValueFrom.SecretKeyRef != nil:
			env = append(env, e.Name+"="+token)
		default:
			t.Fatalf("forwarder env %s: no stand-in for %+v", e.Name, e.ValueFrom)
		}
	}
	var defined []string
	for _, kv := range env {
		defined = append(defined, "${"+strings.SplitN(kv, "=", 2)[0]+"}")
	}
	cmd := exec.Command(envsubst, strings.Join(defined, " "))
	cmd.Env = env
	cmd.Stdin = strings.NewReader(tmpl)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("envsubst: %v", err)
	}
	return string(out)
}

// startNginx serves conf (one server block) with a minimal main config,
// as the image's nginx.conf includes conf.d/*.conf, and returns its base
// URL once it answers.
func startNginx(t *testing.T, nginx, conf string, port int) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "conf.d"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "conf.d", "reap-forwarder.conf"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	main := fmt.Sprintf(`daemon off;
master_process off;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events {}
http {
    access_log off;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    include %[1]s/conf.d/*.conf;
}
`, dir)
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(main), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(nginx, "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", filepath.Join(dir, "nginx.conf"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	stacktest.Eventually(t, 10*time.Second, func() (bool, string) {
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Fatalf("nginx exited: %v\n%s%s", waitErr, stderr.String(), log)
		default:
		}
		resp, err := http.Get(base + "/healthz")
		if err != nil {
			return false, fmt.Sprintf("nginx not answering /healthz: %v", err)
		}
		resp.Body.Close()
		log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
		return resp.StatusCode == http.StatusOK, fmt.Sprintf("nginx answers /healthz with %d\n%s", resp.StatusCode, log)
	})
	return base
}

func freePort(t *testing.T) int {
	t.Helper()
	ports, err := controlplane.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	return ports[0]
}
