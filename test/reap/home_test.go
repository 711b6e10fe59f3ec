package reap_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"labkeep/localrun/stacktest"
	"labkeep/shared/kube"
	"labkeep/shared/reap"
)

// homeLab is a VM lab that keeps the student's home.
const homeLab = `labs:
- {name: vm-home, kind: vm, nodes: [{role: vm}], disk: {containerDisk: quay.io/containerdisks/fedora:41}, home: {size: 1Gi, mountPath: /home/student}}
`

// Students' homes are reaped once no session has held them for
// LABKEEP_REAP_HOME_RETENTION, on the real API server and database: the
// dry run lists an unused home first and deletes nothing; a home used
// within the retention, one a live session held at the run's look, and
// another environment's home stay; a delete the API refuses is reported
// and done by the next run.
func TestUnusedHomesAreReaped(t *testing.T) {
	h := newBackend(t, stacktest.Options{LabsYAML: homeLab})
	ctx := context.Background()
	day := 24 * time.Hour
	h.App.Reaper.Config.HomeRetention = 30 * day
	claims := h.Kube.CoreV1().PersistentVolumeClaims(h.Namespace)
	exists := func(name string) bool {
		t.Helper()
		c, err := claims.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		return c.DeletionTimestamp == nil
	}
	homesIn := func(r reap.Report) []string {
		var names []string
		for _, it := range r.Items {
			if it.Kind == reap.Home {
				names = append(names, strings.Join(it.Objects, ","))
			}
		}
		return names
	}

	// erin's home: used once, her session closed at once.
	erin := h.open("erin", "vm-home")
	if erin.Home != kube.HomeName(h.Env, "erin", "vm") || !exists(erin.Home) {
		t.Fatalf("erin's session holds home %q; exists: %v", erin.Home, exists(erin.Home))
	}
	if r := h.Close("erin"); r.Status != 200 {
		t.Fatalf("close: %d %s", r.Status, r.Body)
	}
	// frank's home: his session runs on until the reaper expires it.
	frank := h.open("frank", "vm-home")
	// Another environment's home in the same namespace, as old as erin's.
	foreign := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: kube.HomeName("other-env", "erin", ""), Labels: map[string]string{
			kube.LabelEnv: "other-env", kube.LabelStudent: kube.StudentHash("erin"), kube.LabelRole: kube.RoleHome, kube.LabelHome: ""}},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
	}
	if _, err := claims.Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { claims.Delete(context.Background(), foreign.Name, metav1.DeleteOptions{}) })

	// 29 days on: erin's home is within the retention; frank's session
	// expires in this run, which saw it live.
	h.Clock.Advance(29 * day)
	if r := h.run(); len(homesIn(r)) != 0 || r.Counts[reap.Expired] != 1 {
		t.Errorf("day 29: homes reaped %v, expired %d; want none and frank's session", homesIn(r), r.Counts[reap.Expired])
	}
	// 31 days on: erin's home is past it; frank's last use was day 29.
	h.Clock.Advance(2 * day)
	want := []string{"PersistentVolumeClaim/" + erin.Home}
	h.App.Reaper.Config.DryRun = true
	if r := h.run(); !slices.Equal(homesIn(r), want) || !exists(erin.Home) {
		t.Errorf("dry run: homes %v, erin's home exists %v; want %v listed and kept", homesIn(r), exists(erin.Home), want)
	}
	h.App.Reaper.Config.DryRun = false
	h.Faults.FailDeletesOf(erin.Home)
	r := h.run()
	failed := slices.ContainsFunc(r.Failures, func(f reap.Failure) bool { return f.Kind == reap.Home && f.Object == erin.Home })
	if !failed || len(homesIn(r)) != 0 || !exists(erin.Home) {
		t.Errorf("a refused delete: failures %+v, homes %v, erin's home exists %v; want the failure reported and the home kept", r.Failures, homesIn(r), exists(erin.Home))
	}
	h.Faults.Heal()
	if r := h.run(); !slices.Equal(homesIn(r), want) || exists(erin.Home) {
		t.Errorf("the next run: homes %v, erin's home exists %v; want it deleted", homesIn(r), exists(erin.Home))
	}
	for name, what := range map[string]string{frank.Home: "frank's home, used on day 29", foreign.Name: "another environment's home"} {
		if !exists(name) {
			t.Errorf("%s (%s) was deleted", what, name)
		}
	}
}
