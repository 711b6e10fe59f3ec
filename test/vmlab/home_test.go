package vmlab_test

import (
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"labkeep/localrun/stacktest"
	"labkeep/shared/labs"
)

// homeLabs is the local sample catalog (localLabs) whose linux-vm lab
// keeps a home of size at path.
func homeLabs(t *testing.T, size, path string) string {
	t.Helper()
	var f struct {
		Labs []labs.Lab `json:"labs"`
	}
	if err := yaml.UnmarshalStrict(localLabs(t), &f); err != nil {
		t.Fatal(err)
	}
	found := false
	for i := range f.Labs {
		if f.Labs[i].Name == "linux-vm" {
			f.Labs[i].Home, found = &labs.Home{Size: size, MountPath: path}, true
		}
	}
	if !found {
		t.Fatal("infra/base/labs.yaml has no lab linux-vm")
	}
	out, err := yaml.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// A vm lab that keeps a home, on real KubeVirt: at the student's first
// open the guest finds the home as its second disk, formats it and mounts
// it at the lab's path (ext4, labelled); a file written there is there
// at the student's next open, in a new guest booted from a fresh
// containerDisk, where the disk was not formatted again.
func TestVMHomeKeepsTheStudentsFiles(t *testing.T) {
	const path = "/home/student"
	d := stacktest.Deploy(t, st, stacktest.Options{LabsYAML: homeLabs(t, "1Gi", path), Quota: true})
	inGuest := func(round, cmd string) string {
		t.Helper()
		v := d.Opened("vera", "linux-vm")
		key := signer(t, v)
		opened := time.Now()
		running := d.WaitRunning("vera", 10*time.Minute)
		t.Logf("%s open: running in %s", round, time.Since(opened).Round(100*time.Millisecond))
		if running.Home == nil || running.Home.Path != path {
			t.Fatalf("%s open: the session names home %+v, want one at %s", round, running.Home, path)
		}
		n := running.Nodes[0].SSH
		out, err := stacktest.SSHRun(net.JoinHostPort(n.Host, strconv.Itoa(n.Port)), n.User, key, stacktest.StrictHosts(t, n.KnownHosts), cmd)
		if err != nil {
			t.Fatalf("%s open: %s: %q, %v", round, cmd, out, err)
		}
		if r := d.Close("vera"); r.Status != http.StatusOK {
			t.Fatalf("%s close = %d %s", round, r.Status, r.Body)
		}
		d.WaitGone(v.ID)
		return out
	}
	mount := "findmnt -n -o SOURCE,FSTYPE,LABEL " + path + "; "
	first := inGuest("first", mount+"echo kept > "+path+"/notes.txt && sync && cat "+path+"/notes.txt")
	second := inGuest("second", mount+"cat "+path+"/notes.txt")
	for round, out := range map[string]string{"first": first, "second": second} {
		t.Logf("%s open: %q", round, out)
		lines := strings.Split(out, "\n")
		if len(lines) != 2 || !strings.Contains(lines[0], " ext4 ") || !strings.HasSuffix(lines[0], " labkeep-home") || lines[1] != "kept" {
			t.Errorf("%s open: mount and notes.txt read %q; want the home's ext4 (label labkeep-home) at %s holding \"kept\"", round, out, path)
		}
	}
}
