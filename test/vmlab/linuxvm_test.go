package vmlab_test

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"labkeep/infra"
	"labkeep/localrun/stack"
	"labkeep/localrun/stacktest"
)

// deploy deploys the functions with the sample labs made local
// (stack.LocalVMLabs).
func deploy(t *testing.T) *stacktest.Deployment {
	t.Helper()
	catalog, err := infra.File("labs.yaml")
	if err != nil {
		t.Fatal(err)
	}
	local, err := stack.LocalVMLabs(catalog)
	if err != nil {
		t.Fatal(err)
	}
	return stacktest.Deploy(t, st, stacktest.Options{LabsYAML: string(local), Quota: true})
}

// signer parses the private key an open returned.
func signer(t *testing.T, v stacktest.SessionView) ssh.Signer {
	t.Helper()
	if v.PrivateKey == "" {
		t.Fatalf("the open returned no private key")
	}
	k, err := ssh.ParsePrivateKey([]byte(v.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestLinuxVMRunsWhenItsGuestAnswersSSH opens the linux-vm lab through the
// functions: the session reads running only once the guest's sshd
// answers, so the student's first login right then succeeds, as root, with
// the key the open returned and the session's host key checked strictly;
// the key of another session is refused. Closing it stops the guest and
// leaves nothing.
func TestLinuxVMRunsWhenItsGuestAnswersSSH(t *testing.T) {
	d := deploy(t)
	opened := time.Now()
	alice := d.Opened("alice", "linux-vm")
	key := signer(t, alice)
	// Another session's key: bob's open returns it; his session is
	// closed at once (it never needs to boot).
	bob := d.Opened("bob", "linux-vm")
	bobKey := signer(t, bob)
	if r := d.Close("bob"); r.Status != http.StatusOK {
		t.Fatalf("close bob = %d %s", r.Status, r.Body)
	}

	var running stacktest.SessionView
	stacktest.Eventually(t, 10*time.Minute, func() (bool, string) {
		r := d.Do("GET", "/getSession", d.Token("alice", "student"), "", "")
		running = r.Session
		return r.Status == http.StatusOK && r.Session.Status == "running", fmt.Sprintf("%d %s", r.Status, r.Body)
	})
	t.Logf("linux-vm: open → running in %s (guest under software emulation)", time.Since(opened).Round(100*time.Millisecond))
	if len(running.Nodes) != 1 || running.Nodes[0].SSH.Host == "" || running.Nodes[0].SSH.KnownHosts == "" {
		t.Fatalf("running session has no reachable node: %+v", running.Nodes)
	}
	n := running.Nodes[0].SSH
	addr := net.JoinHostPort(n.Host, strconv.Itoa(n.Port))
	hosts := stacktest.StrictHosts(t, n.KnownHosts)
	out, err := stacktest.SSHRun(addr, n.User, key, hosts, "id -u")
	if err != nil || out != "0" {
		t.Fatalf("first login as %s at %s right when the session read running: id -u = %q, %v; want 0", n.User, addr, out, err)
	}
	t.Logf("linux-vm: open → first login in %s", time.Since(opened).Round(100*time.Millisecond))
	if out, err := stacktest.SSHRun(addr, n.User, bobKey, hosts, "id -u"); err == nil {
		t.Errorf("another session's key logged in to alice's guest (id -u = %q)", out)
	}

	if r := d.Close("alice"); r.Status != http.StatusOK {
		t.Fatalf("close alice = %d %s", r.Status, r.Body)
	}
	d.WaitGone(alice.ID)
	d.WaitGone(bob.ID)
}
