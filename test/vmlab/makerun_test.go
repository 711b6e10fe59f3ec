package vmlab_test

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"labkeep/localrun/images"
	"labkeep/localrun/stacktest"
)

// What `make run` serves on a stack with real KubeVirt boots real guests:
// its sample linux-vm is made local (the local guest disk) and, opened
// with the student token it prints, becomes running when the guest
// answers SSH, and the student logs in as root with the key and host key
// the open gave.
func TestMakeRunBootsARealVM(t *testing.T) {
	srv := stacktest.MakeRun(t, st, nil, nil)
	lab, ok := srv.App.Labs.Get("linux-vm")
	if !ok || lab.Disk.ContainerDisk != images.GuestDebian {
		t.Fatalf("make run's linux-vm: %+v, want the local guest disk %s", lab, images.GuestDebian)
	}
	c := stacktest.NewClient(t, srv.URL)
	opened := time.Now()
	r := c.Do("POST", "/openSession", srv.StudentToken, `{"lab":"linux-vm"}`, "")
	if r.Status != http.StatusCreated {
		t.Fatalf("open = %d %s", r.Status, r.Body)
	}
	key := signer(t, r.Session)
	var v stacktest.SessionView
	stacktest.Eventually(t, 10*time.Minute, func() (bool, string) {
		g := c.Do("GET", "/getSession", srv.StudentToken, "", "")
		v = g.Session
		return g.Status == http.StatusOK && v.Status == "running", fmt.Sprintf("%d %s", g.Status, g.Body)
	})
	t.Logf("make run's linux-vm: open → running in %s", time.Since(opened).Round(100*time.Millisecond))
	n := v.Nodes[0].SSH
	out, err := stacktest.SSHRun(net.JoinHostPort(n.Host, strconv.Itoa(n.Port)), n.User, key, stacktest.StrictHosts(t, n.KnownHosts), "id -u")
	if err != nil || out != "0" {
		t.Fatalf("login to make run's VM: id -u = %q, %v; want 0", out, err)
	}
	if r := c.Do("POST", "/closeSession", srv.StudentToken, "", ""); r.Status != http.StatusOK {
		t.Fatalf("close = %d %s", r.Status, r.Body)
	}
	// The next test needs the node's CPU: the guest must be gone.
	_, dyn := stacktest.AdminClients(t, st)
	stacktest.Eventually(t, 3*time.Minute, func() (bool, string) {
		left := stacktest.Names(stacktest.ListObjects(t, dyn, srv.App.Config.Kube.Namespace, stacktest.Listing{Kinds: []string{"VirtualMachine", "VirtualMachineInstance"}}))
		return len(left) == 0, fmt.Sprintf("left after close: %v", left)
	})
}
