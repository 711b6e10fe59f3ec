package vmlab_test

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"labkeep/infra"
	"labkeep/localrun/stack"
	"labkeep/localrun/stacktest"
	"labkeep/shared/session"
)

// deploy deploys the functions with o, the sample labs made local
// (localLabs) and the shipped ResourceQuotas applied.
func deploy(t *testing.T, o stacktest.Options) *stacktest.Deployment {
	t.Helper()
	o.LabsYAML, o.Quota = string(localLabs(t)), true
	return stacktest.Deploy(t, st, o)
}

// localLabs is the sample catalog made local (stack.LocalVMLabs).
func localLabs(t *testing.T) []byte {
	t.Helper()
	catalog, err := infra.File("labs.yaml")
	if err != nil {
		t.Fatal(err)
	}
	local, err := stack.LocalVMLabs(catalog)
	if err != nil {
		t.Fatal(err)
	}
	return local
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
// the key of another session is refused; the web terminal is the guest's
// serial console (seesSerialConsole); a guest powered off from inside
// comes back (comesBackAfterPoweroff). Closing it stops the guest and
// leaves nothing.
func TestLinuxVMRunsWhenItsGuestAnswersSSH(t *testing.T) {
	d := deploy(t, stacktest.Options{})
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
	t.Run("the web terminal is the guest's serial console", func(t *testing.T) {
		seesSerialConsole(t, d, "alice", alice.ID)
	})

	t.Run("a guest powered off from inside comes back at its new address, no ghost", func(t *testing.T) {
		comesBackAfterPoweroff(t, d, "alice", key, running)
	})

	vm := session.NodeName(alice.ID, running.Nodes[0].Name)
	if len(guestProcesses(t, d.Namespace, vm)) != 1 {
		t.Fatalf("no QEMU process runs the guest of %s", vm)
	}
	if r := d.Close("alice"); r.Status != http.StatusOK {
		t.Fatalf("close alice = %d %s", r.Status, r.Body)
	}
	d.WaitGone(alice.ID)
	waitGuestStopped(t, d, vm)
	d.WaitGone(bob.ID)
}

// The three-VM k8s-cluster lab boots three real guests at once (the local
// catalog gives each half a CPU and 1 GiB, so the three fit the node): the
// session reads running only when every guest answers SSH, the student
// logs in to each as root, and each reaches the others' sshd across the
// session's network.
func TestK8sClusterBootsThreeGuests(t *testing.T) {
	d := deploy(t, stacktest.Options{})
	opened := time.Now()
	v := d.Opened("kim", "k8s-cluster")
	key := signer(t, v)
	running := d.WaitRunning("kim", 15*time.Minute)
	t.Logf("k8s-cluster: open → running in %s (three guests under software emulation)", time.Since(opened).Round(100*time.Millisecond))
	if len(running.Nodes) != 3 {
		t.Fatalf("k8s-cluster has %d nodes, want 3: %+v", len(running.Nodes), running.Nodes)
	}
	for _, n := range running.Nodes {
		addr := net.JoinHostPort(n.SSH.Host, strconv.Itoa(n.SSH.Port))
		var peers []string
		for _, o := range running.Nodes {
			if o.Name != n.Name {
				peers = append(peers, fmt.Sprintf("timeout 10 bash -c '</dev/tcp/%s/22' && echo %s", o.SSH.Host, o.Name))
			}
		}
		out, err := stacktest.SSHRun(addr, n.SSH.User, key, stacktest.StrictHosts(t, n.SSH.KnownHosts), "id -u; "+strings.Join(peers, "; "))
		if err != nil {
			t.Errorf("node %s at %s: %q, %v", n.Name, addr, out, err)
			continue
		}
		if lines := strings.Fields(out); len(lines) != 3 || lines[0] != "0" {
			t.Errorf("node %s: id -u and its peers' sshd gave %q, want 0 and both peers", n.Name, out)
		}
	}
	if r := d.Close("kim"); r.Status != http.StatusOK {
		t.Fatalf("close kim = %d %s", r.Status, r.Body)
	}
	d.WaitGone(v.ID)
}
