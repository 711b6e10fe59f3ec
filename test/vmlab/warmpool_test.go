package vmlab_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"labkeep/localrun/stacktest"
	"labkeep/shared/session"
)

// authorized is k's authorized_keys line.
func authorized(k ssh.Signer) string {
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k.PublicKey())))
}

// A student's open takes the pool's running guest: the VM booted before
// the student existed, with the platform's keys alone; the claim puts the
// student's key into the keys Secret and KubeVirt's guest agent rewrites
// root's authorized_keys in the running guest from it. So the student logs
// in with their key and the session's host key, and a key that was in the
// guest before the claim but is not in the Secret (written there by hand
// through the platform's key) is refused after it: the guest holds exactly
// the Secret's keys. The platform's own key keeps working.
func TestWarmPoolGuestTakesTheClaimingStudentsKey(t *testing.T) {
	platform := stacktest.NewKey(t)
	d := deploy(t, stacktest.Options{WarmPool: "linux-vm=1", PlatformSSHKeys: []string{authorized(platform)}})
	id := d.FillPool("linux-vm", 1, 10*time.Minute)[0]
	row := d.Session(id)
	n := row.Nodes[0]
	addr := net.JoinHostPort(n.SSHHost, strconv.Itoa(int(n.SSHPort)))
	hosts := stacktest.StrictHosts(t, row.KnownHostsLine(n.SSHHost, n.SSHPort))

	// The guest agent has written the pool's keys (the platform's): a
	// write by hand from here on is not overwritten by that first sync.
	vmi := session.NodeName(id, n.Name)
	stacktest.Eventually(t, 3*time.Minute, func() (bool, string) {
		u, err := d.Dyn.Resource(stacktest.Resource("VirtualMachineInstance")).Namespace(d.Namespace).Get(context.Background(), vmi, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && m["type"] == "AccessCredentialsSynchronized" {
				return m["status"] == "True", fmt.Sprintf("AccessCredentialsSynchronized %v: %v", m["status"], m["message"])
			}
		}
		return false, "no AccessCredentialsSynchronized condition on VMI " + vmi
	})
	stray := stacktest.NewKey(t)
	if out, err := stacktest.SSHRun(addr, "root", platform, hosts, "printf '\\n%s\\n' '"+authorized(stray)+"' >> /root/.ssh/authorized_keys && id -u"); err != nil || out != "0" {
		t.Fatalf("the platform's key on the idle guest: %q, %v", out, err)
	}
	if _, err := stacktest.SSHRun(addr, "root", stray, hosts, "true"); err != nil {
		t.Fatalf("the key written by hand does not log in before the claim: %v", err)
	}

	claimed := time.Now()
	v := d.Opened("pia", "linux-vm")
	if v.ID != id || v.Status != "running" {
		t.Fatalf("open = session %s (%s), want the pool's running %s", v.ID, v.Status, id)
	}
	answered := time.Since(claimed)
	key := signer(t, v)
	var out string
	var err error
	stacktest.Eventually(t, 5*time.Minute, func() (bool, string) {
		out, err = stacktest.SSHRun(addr, "root", key, hosts, "id -u")
		return err == nil, fmt.Sprintf("the student's key: %v", err)
	})
	if out != "0" {
		t.Errorf("the student logged in as uid %q, want root", out)
	}
	t.Logf("claim: open answered in %s; first login with the student's key %s after the open", answered.Round(10*time.Millisecond), time.Since(claimed).Round(100*time.Millisecond))
	if _, err := stacktest.SSHRun(addr, "root", stray, hosts, "true"); err == nil {
		t.Error("the key written into the guest before the claim still logs in after it")
	}
	if _, err := stacktest.SSHRun(addr, "root", platform, hosts, "true"); err != nil {
		t.Errorf("the platform's key after the claim: %v", err)
	}
	if r := d.Close("pia"); r.Status != 200 {
		t.Fatalf("close pia = %d %s", r.Status, r.Body)
	}
	d.WaitGone(id)
}
