package labs

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A lab's home is checked when the catalog loads; a vm lab's home goes to
// its first node unless the lab names another.
func TestParseHome(t *testing.T) {
	c, err := Parse([]byte(`
labs:
- {name: shell, kind: pod, image: i, nodes: [{role: x}], home: {size: 1Gi, mountPath: /root}}
- {name: net, kind: pod, image: i, nodes: [{role: x}], home: {size: 2Gi, mountPath: /home/lab, group: netsec-101}}
- {name: vm, kind: vm, nodes: [{role: control}, {role: worker, count: 2}], disk: {containerDisk: i}, home: {size: 1Gi, mountPath: /home/student}}
- {name: vm-worker, kind: vm, nodes: [{role: control}, {role: worker, count: 2}], disk: {containerDisk: i}, home: {size: 1Gi, mountPath: /srv/home, node: worker-2}}
- {name: plain, kind: pod, image: i, nodes: [{role: x}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*Home{}
	for _, name := range c.Names() {
		l, _ := c.Get(name)
		got[name] = l.Home
	}
	want := map[string]*Home{
		"shell":     {Size: "1Gi", MountPath: "/root"},
		"net":       {Size: "2Gi", MountPath: "/home/lab", Group: "netsec-101"},
		"vm":        {Size: "1Gi", MountPath: "/home/student", Node: "control"},
		"vm-worker": {Size: "1Gi", MountPath: "/srv/home", Node: "worker-2"},
		"plain":     nil,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("homes by lab (-want +got):\n%s", diff)
	}
	groups := map[string]string{}
	for _, name := range c.Names() {
		l, _ := c.Get(name)
		groups[name] = l.HomeGroup()
	}
	// Pod and vm labs never share a home: a vm lab's holds a disk image.
	wantGroups := map[string]string{"shell": "", "net": "netsec-101", "vm": "vm", "vm-worker": "vm", "plain": ""}
	if diff := cmp.Diff(wantGroups, groups); diff != "" {
		t.Errorf("home groups by lab (-want +got):\n%s", diff)
	}
}

func TestParseRejectsBadHomes(t *testing.T) {
	pod := func(home string) string {
		return `labs: [{name: a, kind: pod, image: i, nodes: [{role: x}], home: ` + home + `}]`
	}
	tests := []struct {
		name, doc, wantErr string
	}{
		{"no size", pod(`{mountPath: /root}`), `home.size ""`},
		{"a size that is no quantity", pod(`{size: big, mountPath: /root}`), `home.size "big"`},
		{"a zero size", pod(`{size: "0", mountPath: /root}`), "must be positive"},
		{"no mount path", pod(`{size: 1Gi}`), "clean absolute path"},
		{"a relative mount path", pod(`{size: 1Gi, mountPath: home}`), "clean absolute path"},
		{"an unclean mount path", pod(`{size: 1Gi, mountPath: /home/../etc}`), "clean absolute path"},
		{"a trailing slash", pod(`{size: 1Gi, mountPath: /home/}`), "clean absolute path"},
		{"the root", pod(`{size: 1Gi, mountPath: /}`), "whole file system"},
		{"a system directory", pod(`{size: 1Gi, mountPath: /etc}`), "in /etc, a system directory"},
		{"inside a system directory", pod(`{size: 1Gi, mountPath: /usr/local/work}`), "in /usr, a system directory"},
		{"a space in the path", pod(`{size: 1Gi, mountPath: "/my home"}`), "may only hold"},
		{"a comma in the path", pod(`{size: 1Gi, mountPath: "/a,b"}`), "may only hold"},
		{"a group that is no DNS label", pod(`{size: 1Gi, mountPath: /root, group: Net_Sec}`), "home.group"},
		{"a pod lab in the vm labs' homes", pod(`{size: 1Gi, mountPath: /root, group: vm}`), "the homes of vm labs"},
		{"a pod lab in a vm lab group's home", pod(`{size: 1Gi, mountPath: /root, group: vm-netsec}`), "the homes of vm labs"},
		{"a vm lab group too long with vm- before it", `labs: [{name: a, kind: vm, nodes: [{role: x}], disk: {containerDisk: i}, home: {size: 1Gi, mountPath: /home/s, group: eighteen-char-name}}]`, "17 on a vm lab"},
		{"a long group", pod(`{size: 1Gi, mountPath: /root, group: a-very-long-course-name}`), "at most 20"},
		{"a node on a pod lab", pod(`{size: 1Gi, mountPath: /root, node: x}`), "only vm labs"},
		{"an unknown vm node", `labs: [{name: a, kind: vm, nodes: [{role: x}], disk: {containerDisk: i}, home: {size: 1Gi, mountPath: /home/s, node: other}}]`, `home.node "other": not a node`},
		{"an unknown field", pod(`{size: 1Gi, mountPath: /root, sise: 2Gi}`), "sise"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Parse error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}
