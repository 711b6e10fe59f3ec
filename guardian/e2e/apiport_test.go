package e2e

import (
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"labkeep/guardian/internal/testcgroup"
)

// Root in the workspace shares the Pod's network namespace: after killing
// guardian it binds guardian's API port. The restarted guardian kills the
// squatter (a workspace process, so fair game), says so in an alert naming
// it, and serves its API again.
func TestAPIPortTakenBack(t *testing.T) {
	ws := newWorkspace(t, testcgroup.Limits{MemoryBytes: 256 << 20, Pids: 64, CPUs: 1})
	g := ws.startGuardian(t.TempDir()+"/state.json", nil)
	addr := strings.TrimPrefix(g.api, "http://")
	g.kill()

	squat := ws.user(bins.workload, "listen", "-addr", addr)
	// It holds the port once a connection is taken (into its backlog: it
	// never accepts); guardian, the only other listener, is dead.
	if !eventually(10*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil || !squat.alive()
	}) || !squat.alive() {
		t.Fatalf("the squatter never held %s: alive %v, %s", addr, squat.alive(), squat.stderr.String())
	}

	restarted := time.Now()
	g.start() // fails the test unless /healthz answers 200 within 20 s
	t.Logf("guardian serves /healthz %v after its restart with the port taken", time.Since(restarted).Round(time.Millisecond))

	if !eventually(10*time.Second, func() bool { return !squat.alive() }) {
		t.Fatal("the squatter still runs after guardian took its port back")
	}
	<-squat.done
	if sig, ok := squat.killedBySignal(); !ok || (sig != syscall.SIGTERM && sig != syscall.SIGKILL) {
		t.Errorf("squatter ended with %v; want killed by guardian's SIGTERM or SIGKILL", squat.state)
	}

	resp, err := http.Get(g.api + "/alerts")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Alerts []struct {
			Kind, Message string
			Fields        map[string]string
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	pid := strconv.Itoa(squat.cmd.Process.Pid)
	found := false
	for _, a := range body.Alerts {
		if a.Kind == "api-port-taken" {
			found = a.Fields["pid"] == pid && a.Fields["exe"] == bins.workload
			t.Logf("alert: %s %v", a.Message, a.Fields)
		}
	}
	if !found {
		t.Errorf("no api-port-taken alert naming PID %s (%s): %+v", pid, bins.workload, body.Alerts)
	}
	if !ws.stillSame(ws.sshd.id) || !ws.stillSame(ws.init.id) {
		t.Error("a protected process was killed taking the port back")
	}
}
