package kube

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"labkeep/shared/labs"
	"labkeep/shared/seating"
	"labkeep/shared/session"
)

// What a pool instance's objects differ in, by pool state: an unclaimed
// instance's anchor and Pod live its TTL longer, every pool object carries
// LabelPool and no student's hash, and only a pool Pod has root's ~/.ssh on
// an emptyDir (where a claim's keys survive a container restart).
func TestPoolInstanceObjects(t *testing.T) {
	start := time.Date(2026, 11, 30, 13, 0, 0, 0, time.UTC)
	tests := []struct {
		name         string
		pool         session.PoolState
		wantDeadline int64
		wantLabel    string // LabelPool
		wantStudent  bool   // LabelStudent present
		wantSSHDir   bool
	}{
		{name: "a student's session", wantDeadline: 11700, wantStudent: true},
		{name: "an unclaimed instance: 4 h TTL added", pool: session.PoolIdle, wantDeadline: 11700 + 4*3600, wantLabel: PoolWarm, wantSSHDir: true},
		{name: "a claimed instance (objects as built for it)", pool: session.PoolClaimed, wantDeadline: 11700, wantLabel: PoolWarm, wantSSHDir: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := testBuilder(t, "shell")
			b.sess.Pool = tc.pool
			b.sess.StartedAt, b.sess.MaxExpiresAt = start, start.Add(4*time.Hour)
			anchor := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: session.AnchorName(b.sess.ID), UID: "u"}}
			pod := mustWorkspace(t, b, anchor)
			_, student := pod.Labels[LabelStudent]
			sshDir := false
			for _, m := range pod.Spec.Containers[0].VolumeMounts {
				sshDir = sshDir || (m.Name == PoolKeysVolume && m.MountPath == RootSSHDir)
			}
			got := []any{*b.anchor().Spec.ActiveDeadlineSeconds, *pod.Spec.ActiveDeadlineSeconds, pod.Labels[LabelPool], student, sshDir}
			want := []any{tc.wantDeadline, tc.wantDeadline, tc.wantLabel, tc.wantStudent, tc.wantSSHDir}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("anchor deadline, Pod deadline, pool label, student label, ~/.ssh emptyDir (-want +got):\n%s", diff)
			}
		})
	}
}

func TestAuthorizedKeys(t *testing.T) {
	cfg := Config{PlatformSSHKeys: []string{"ssh-ed25519 AAAA grader"}}
	for name, tc := range map[string]struct {
		key  string
		want []string
	}{
		"a student's key, then the platform's":  {"ssh-ed25519 BBBB pia", []string{"ssh-ed25519 BBBB pia", "ssh-ed25519 AAAA grader"}},
		"an unclaimed instance: platform alone": {"", []string{"ssh-ed25519 AAAA grader"}},
	} {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, authorizedKeys(session.Session{StudentKey: tc.key}, cfg)); diff != "" {
				t.Errorf("authorizedKeys (-want +got):\n%s", diff)
			}
		})
	}
}

// A claim rebuilds the instance's keys Secrets from the instance alone:
// the session it builds them for keeps the instance's id and nodes,
// carries the warm pool's label and no student's hash (the functions may
// not relabel objects), and authorizes the student's key with the
// platform's. Without a student key there is nothing to claim with.
func TestClaimedSession(t *testing.T) {
	cfg := Config{PlatformSSHKeys: []string{"ssh-ed25519 AAAA grader"}}
	inst := seating.Instance{ID: "i-1", Lab: "linux-vm", Kind: labs.KindVM, Nodes: []session.Node{{Name: "vm", Role: "vm"}}, Ready: true}
	s := claimedSession(inst, "ssh-ed25519 BBBB pia")
	b := builder{cfg: cfg, sess: s}
	labels := b.labels("vm", "vm")
	_, student := labels[LabelStudent]
	got := []any{s.ID, s.Nodes, labels[LabelSession], labels[LabelPool], student, authorizedKeys(s, cfg)}
	want := []any{"i-1", inst.Nodes, "i-1", PoolWarm, false, []string{"ssh-ed25519 BBBB pia", "ssh-ed25519 AAAA grader"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("id, nodes, session label, pool label, student label, authorized keys (-want +got):\n%s", diff)
	}
	if err := (&Cluster{}).Claim(context.Background(), inst, "", labs.Lab{Name: "linux-vm", Kind: labs.KindVM}); err == nil {
		t.Error("Claim without a student key = nil; want an error")
	}
}
