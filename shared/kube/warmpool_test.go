package kube

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
