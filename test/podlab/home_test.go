package podlab_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"labkeep/localrun/stacktest"
	"labkeep/shared/kube"
	"labkeep/shared/reap"
)

// homeLabs keep homes: shell the student's default home, course a
// group's of the same size.
const homeLabs = `labs:
- name: shell
  kind: pod
  image: ghcr.io/labkeep/workspace:debian12
  nodes: [{role: workspace, cpu: 500m, memory: 512Mi}]
  home: {size: 256Mi, mountPath: /home/student}
- name: course
  kind: pod
  image: ghcr.io/labkeep/workspace:debian12
  nodes: [{role: workspace, cpu: 500m, memory: 512Mi}]
  home: {size: 256Mi, mountPath: /home/student, group: course-1}
`

// Students keep their work, on the real node: what a student saved in
// their home is there at their next open, another student's session sees
// a home of its own, empty; the home is as large as the lab says and a
// full one refuses writes while SSH and the workspace go on; an open
// that would take a student's homes past LABKEEP_HOME_TOTAL is refused
// with 409 home_quota and leaves no session and no home behind. The home
// is downloaded as an archive while a session runs and while none holds
// it (through a reader Pod, which goes with the download; one a crashed
// function left behind goes with the reaper's next run once it has
// ended).
func TestHomeOutlivesSessions(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{LabsYAML: homeLabs, HomeTotal: "400Mi"})
	ctx := context.Background()
	homes := func() map[string]string {
		t.Helper()
		list, err := d.Kube.CoreV1().PersistentVolumeClaims(d.Namespace).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelEnv + "=" + d.Env})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, c := range list.Items {
			out[c.Name] = string(c.Status.Phase)
		}
		return out
	}

	erin := openLab(t, d, "erin", "shell", nil)
	erin.waitRunning(3 * time.Minute)
	size, err := strconv.ParseInt(strings.TrimSpace(erin.mustRun("echo 'my notes' > /home/student/notes.txt && sync && df -B1 --output=size /home/student | tail -1")), 10, 64)
	if err != nil || size <= 200<<20 || size > 256<<20 {
		t.Errorf("the home's file system holds %d bytes (%v); want the lab's 256Mi less the file system's own", size, err)
	}
	erin.close()
	d.WaitGone(erin.opened.ID)
	if got := homes(); len(got) != 1 || got[kube.HomeName(d.Env, "erin", "")] != "Bound" {
		t.Errorf("homes after erin's session ended: %v; want erin's, bound", got)
	}

	again := openLab(t, d, "erin", "shell", nil)
	again.waitRunning(3 * time.Minute)
	if got := strings.TrimSpace(again.mustRun("cat /home/student/notes.txt")); got != "my notes" {
		t.Errorf("erin's notes at her next open: %q", got)
	}
	frank := openLab(t, d, "frank", "shell", nil)
	frank.waitRunning(3 * time.Minute)
	if got := strings.Fields(frank.mustRun("ls -A /home/student")); len(got) != 1 || got[0] != "lost+found" {
		t.Errorf("frank's home holds %v; want it empty (the file system's lost+found only)", got)
	}

	// Download: erin's home as a streamed archive, the files as written;
	// frank's token gets 403 for it.
	erinHome := kube.HomeName(d.Env, "erin", "")
	again.mustRun("mkdir -p /home/student/src && printf 'int main(){}' > /home/student/src/main.c")
	r := d.Do("GET", "/homeArchive?name="+erinHome, d.Token("erin", "student"), "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("erin's home archive: %d %s", r.Status, r.Body)
	}
	if diff := cmp.Diff(map[string]string{"notes.txt": "my notes\n", "src/main.c": "int main(){}"}, stacktest.Untar(t, r.Body)); diff != "" {
		t.Errorf("erin's home archive (-written +archived):\n%s", diff)
	}
	if r := d.Do("GET", "/homeArchive?name="+erinHome, d.Token("frank", "student"), "", ""); r.Status != http.StatusForbidden {
		t.Errorf("frank downloading erin's home: %d %s; want 403", r.Status, r.Body)
	}

	// A full home is the student's problem: the write fails, SSH, the
	// workspace and guardian go on.
	out, err := again.run("dd if=/dev/zero of=/home/student/fill bs=1M count=400 2>&1; echo rc=$?", nil)
	if err != nil || !strings.Contains(out, "No space left on device") {
		t.Errorf("filling the home: %v %q; want ENOSPC", err, out)
	}
	if got := strings.TrimSpace(again.mustRun("cat /home/student/notes.txt")); got != "my notes" {
		t.Errorf("after the home filled up a new login reads %q", got)
	}
	if c := status(again.pod(), "workspace"); c.RestartCount != 0 {
		t.Errorf("the workspace restarted when its home filled up: %s", again.podState())
	}
	if c := status(again.pod(), "guardian"); c.RestartCount != 0 {
		t.Errorf("guardian restarted when the home filled up: %s", again.podState())
	}
	// A file of another user, readable by its owner alone: the download
	// with no session running reads it all the same.
	again.mustRun("rm /home/student/fill && printf mine > /home/student/private && chown 1000:1000 /home/student/private && chmod 600 /home/student/private")
	again.close()
	d.WaitGone(again.opened.ID)

	// Download while no session holds the home: read by a Pod of its own,
	// which is gone once the archive is.
	r = d.Do("GET", "/homeArchive?name="+erinHome, d.Token("erin", "student"), "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("erin's home archive with no session running: %d %s", r.Status, r.Body)
	}
	want := map[string]string{"notes.txt": "my notes\n", "src/main.c": "int main(){}", "private": "mine"}
	if diff := cmp.Diff(want, stacktest.Untar(t, r.Body)); diff != "" {
		t.Errorf("erin's home archive with no session running (-written +archived):\n%s", diff)
	}
	if r := d.Do("GET", "/homeArchive?name="+erinHome, d.Token("frank", "student"), "", ""); r.Status != http.StatusForbidden {
		t.Errorf("frank downloading erin's unused home: %d %s; want 403", r.Status, r.Body)
	}
	readers := func() []string {
		return d.Objects(kube.LabelEnv + "=" + d.Env + "," + kube.LabelRole + "=" + kube.RoleHomeReader)
	}
	if left := readers(); len(left) != 0 {
		t.Errorf("the download left its reader behind: %v", left)
	}
	testReaderSweep(t, d, erinHome)

	// Erin's default home (256Mi) and a new 256Mi home for the course pass
	// the 400Mi she may keep: refused, and nothing is left of the open.
	before := homes()
	r = d.Do("POST", "/openSession", d.Token("erin", "student"), `{"lab":"course"}`, "")
	var body struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	_ = json.Unmarshal([]byte(r.Body), &body)
	if r.Status != http.StatusConflict || body.Error.Code != "home_quota" || !strings.Contains(body.Error.Message, "400Mi") {
		t.Errorf("open past the student's home total = %d %s; want 409 home_quota naming the total", r.Status, r.Body)
	}
	if after := homes(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("the refused open changed the homes: %v, then %v", before, after)
	}
	var rows int
	if err := d.DB.QueryRow(ctx, "SELECT count(*) FROM sessions WHERE student = 'erin' AND lab = 'course'").Scan(&rows); err != nil || rows != 0 {
		t.Errorf("the refused open left %d session rows (%v)", rows, err)
	}
	t.Logf("home file system %d bytes; homes: %v", size, homes())
}

// testReaderSweep stands in for a function that crashed mid-download:
// readers of home, as the reaper sees them (labels, phase, age), made by
// the test. The reaper's run deletes the one that has ended and leaves
// the one still running, whose download may go on.
func testReaderSweep(t *testing.T, d *stacktest.Deployment, home string) {
	t.Helper()
	ctx := context.Background()
	reader := func(name, sleep string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
				kube.LabelEnv: d.Env, kube.LabelRole: kube.RoleHomeReader, kube.LabelHome: "", "app.kubernetes.io/managed-by": "labkeep"}},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: new(bool),
				Containers: []corev1.Container{{Name: kube.ReaderContainer, Image: "ghcr.io/labkeep/workspace:debian12", Command: []string{"sleep", sleep}}}},
		}
	}
	ended, running := reader(kube.HomeReaderName(home), "0"), reader(kube.HomeReaderName(home+"-course-1"), "600")
	for _, p := range []*corev1.Pod{ended, running} {
		if _, err := d.Kube.CoreV1().Pods(d.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = d.Kube.CoreV1().Pods(d.Namespace).Delete(context.Background(), running.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	})
	phase := func(name string) corev1.PodPhase {
		p, err := d.Kube.CoreV1().Pods(d.Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return "gone"
		}
		if err != nil {
			t.Fatal(err)
		}
		return p.Status.Phase
	}
	stacktest.Eventually(t, 2*time.Minute, func() (bool, string) {
		a, b := phase(ended.Name), phase(running.Name)
		return a == corev1.PodSucceeded && b == corev1.PodRunning, fmt.Sprintf("readers %s, %s", a, b)
	})
	rep, err := d.App.Reaper.RunOnce(ctx, reap.TriggerAdmin)
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Counts[reap.HomeReader]; got != 1 || len(rep.Failures) != 0 {
		t.Errorf("the run deleted %d home readers with failures %v; want the ended one alone", got, rep.Failures)
	}
	if got := phase(ended.Name); got != "gone" {
		t.Errorf("the ended reader after the run: %s; want it gone", got)
	}
	if got := phase(running.Name); got != corev1.PodRunning {
		t.Errorf("the running reader after the run: %s; want it left to its download", got)
	}
}
