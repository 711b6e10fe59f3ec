package reap_test

import (
	"context"
	"encoding/json"
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

// Students see their own homes, with when each goes; an admin sees every
// home and deletes one no session holds, on the real stack over HTTP.
func TestHomesOverHTTP(t *testing.T) {
	h := newBackend(t, stacktest.Options{LabsYAML: homeLab})
	h.App.Reaper.Config.HomeRetention = 30 * 24 * time.Hour
	erin := h.open("erin", "vm-home")
	if r := h.Close("erin"); r.Status != 200 {
		t.Fatalf("close: %d %s", r.Status, r.Body)
	}
	frank := h.open("frank", "vm-home")
	list := func(token, query string) (int, []reap.HomeStatus) {
		t.Helper()
		r := h.Do("GET", "/homes"+query, token, "", "")
		var body struct{ Homes []reap.HomeStatus }
		if r.Status == 200 {
			if err := json.Unmarshal(r.Body, &body); err != nil {
				t.Fatalf("GET /homes%s: %v %s", query, err, r.Body)
			}
		}
		return r.Status, body.Homes
	}
	admin := h.Token("ops", "admin")

	code, homes := list(h.Token("erin", "student"), "")
	if code != 200 || len(homes) != 1 || homes[0].Name != erin.Home || homes[0].InUse || homes[0].Group != "vm" || homes[0].Size != "1Gi" {
		t.Fatalf("erin's homes: %d %+v", code, homes)
	}
	if due := homes[0].DeleteAt; due == nil || !due.Equal(homes[0].LastUse.Add(30*24*time.Hour)) {
		t.Errorf("erin's home goes at %v; want its last use %v plus 30 days", due, homes[0].LastUse)
	}
	if code, homes := list(h.Token("frank", "student"), ""); code != 200 || len(homes) != 1 || homes[0].Name != frank.Home || !homes[0].InUse || homes[0].DeleteAt != nil {
		t.Errorf("frank's homes: %d %+v; want his, in use, with no date to go", code, homes)
	}
	if code, _ := list(h.Token("erin", "student"), "?all=true"); code != 403 {
		t.Errorf("a student listing every home: %d, want 403", code)
	}
	if code, _ := list(h.Token("erin", "student"), "?student=frank"); code != 403 {
		t.Errorf("a student listing another's homes: %d, want 403", code)
	}
	code, homes = list(admin, "?all=true")
	students := map[string]string{}
	for _, x := range homes {
		students[x.Name] = x.Student
	}
	if code != 200 || students[erin.Home] != "erin" || students[frank.Home] != "frank" || len(homes) != 2 {
		t.Errorf("every home for the admin: %d %+v", code, homes)
	}

	del := func(token, name string) (int, string) {
		t.Helper()
		r := h.Do("POST", "/adminDeleteHome", token, `{"name":"`+name+`"}`, "")
		return r.Status, string(r.Body)
	}
	if code, body := del(h.Token("erin", "student"), erin.Home); code != 403 {
		t.Errorf("a student deleting a home: %d %s", code, body)
	}
	if code, body := del(admin, frank.Home); code != 409 || !strings.Contains(body, "home_in_use") {
		t.Errorf("deleting a home in use: %d %s; want 409 home_in_use", code, body)
	}
	if code, body := del(admin, "home-nope"); code != 404 || !strings.Contains(body, "no_home") {
		t.Errorf("deleting no home: %d %s; want 404 no_home", code, body)
	}
	if code, body := del(admin, erin.Home); code != 200 {
		t.Fatalf("deleting erin's unused home: %d %s", code, body)
	}
	if _, homes := list(h.Token("erin", "student"), ""); len(homes) != 0 {
		t.Errorf("erin's homes after the delete: %+v", homes)
	}
}
