package bench_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"labkeep/localrun/benchtable"
	"labkeep/localrun/stacktest"
	"labkeep/shared/session"
)

// failsafeScale is one run of the failsafe benchmark.
type failsafeScale struct {
	vms                int // VM sessions (one Pod session besides)
	maxLifetime, grace time.Duration
	waitRunning        time.Duration
}

// BenchmarkTableFailsafe: with labkeep stopped (no function served, no
// reaper, no scheduler), how long past start + max lifetime + grace a
// session's objects outlive their deadline. What ends them is the
// session's deadline anchor: a Job with activeDeadlineSeconds = max
// lifetime + grace, which the real Job controller fails, the real TTL
// controller then deletes, and the real garbage collector deletes
// everything the Job owns (VMs, the workspace Pod, Secrets, policies);
// the real kubelet stops the workspace Pod, which also carries the same
// activeDeadlineSeconds of its own. The VMs' part after their deletion is
// virtsim's (the stand-in for KubeVirt): no guest boots, so a real guest's
// shutdown is not in the figure.
func BenchmarkTableFailsafe(b *testing.B) {
	sc := failsafeScale{vms: 4, maxLifetime: 40 * time.Second, grace: 20 * time.Second, waitRunning: 35 * time.Second}
	note := ""
	if benchtable.Quick() {
		sc = failsafeScale{vms: 1, maxLifetime: 15 * time.Second, grace: 5 * time.Second, waitRunning: 14 * time.Second}
		note = "quick: shorter lifetimes; "
	}
	for range b.N {
		d := stacktest.Deploy(b, st, stacktest.Options{Lifetime: sc.maxLifetime, MaxLifetime: sc.maxLifetime, DeadlineGrace: sc.grace,
			MaxVMs: 1000, KubeQPS: 500, KubeBurst: 1000, Log: stacktest.Discard()})
		vm, pod, podNote := failsafeRun(b, d, sc)
		c := fmt.Sprintf("labkeep stopped; max lifetime %s + grace %s", sc.maxLifetime, sc.grace)
		rows := []struct {
			kind string
			over []time.Duration
			note string
		}{
			{fmt.Sprintf("VM lab (%d sessions)", sc.vms), vm, "VM, VMI, virt-launcher Pod, Secret; the VMI and launcher Pod go by virtsim and the garbage collector, no real guest shuts down"},
			{"Pod lab (1 session, real workspace Pod)", pod, "workspace Pod stopped by the real kubelet; " + podNote},
		}
		for _, r := range rows {
			mx := slices.Max(r.over)
			benchtable.Record(b, benchtable.Row{
				Group: "Backend-dead failsafe", Case: c, Figure: r.kind + ": deadline → objects gone, max overshoot", Value: mx.Seconds(), Unit: "s",
				Baseline:      "the grace the overshoot adds to (without the anchor nothing deletes them: they live forever)",
				BaselineValue: benchtable.F(sc.grace.Seconds()),
				Note:          fmt.Sprintf("%sall overshoots %v; %s", note, failsafeRounded(r.over), r.note),
			})
		}
	}
}

// failsafeRun opens sc.vms VM sessions and one Pod session, waits until
// they run, stops everything of labkeep and waits until each session's
// objects are gone. It returns each session's overshoot (gone − (start +
// max lifetime + grace)) by kind, and how the workspace Pod ended.
func failsafeRun(b *testing.B, d *stacktest.Deployment, sc failsafeScale) (vm, pod []time.Duration, podNote string) {
	b.Helper()
	type opened struct {
		id, student string
		node        string // the first node's name
		pod         bool
		deadline    time.Time
		gone        time.Time
	}
	var sessions []*opened
	who := stacktest.Suffix()
	open := func(lab string, isPod bool) {
		name := fmt.Sprintf("failsafe-%s-%d", who, len(sessions))
		s := d.Opened(name, lab)
		if !s.MaxExpiresAt.Equal(s.StartedAt.Add(sc.maxLifetime)) {
			b.Fatalf("session %s: maxExpiresAt %s, want startedAt %s + %s", s.ID, s.MaxExpiresAt, s.StartedAt, sc.maxLifetime)
		}
		sessions = append(sessions, &opened{id: s.ID, student: name, node: s.Nodes[0].Name, pod: isPod, deadline: s.MaxExpiresAt.Add(sc.grace)})
	}
	open("shell", true)
	for range sc.vms {
		open("linux-vm", false)
	}
	for _, s := range sessions {
		d.WaitRunning(s.student, sc.waitRunning)
	}
	ws := sessions[0]
	podName := session.NodeName(ws.id, ws.node)
	if p := failsafePod(b, d, podName); p == nil || p.Status.Phase != corev1.PodRunning || p.Spec.NodeName == "" {
		b.Fatalf("the workspace Pod %s is not running on the node before labkeep stops: %+v", podName, p)
	}
	// labkeep stops: no function, no reaper, no scheduler.
	d.Server.Close()
	d.App.Close()
	stopped := time.Now()

	var podEnd []string
	bound := slices.MaxFunc(sessions, func(x, y *opened) int { return x.deadline.Compare(y.deadline) }).deadline.Add(3 * time.Minute)
	for {
		left := map[string]bool{}
		for _, o := range d.List(stacktest.Listing{LeaveOutAnchorPods: true}) {
			left[o.Session] = true
		}
		if p := failsafePod(b, d, podName); p != nil {
			end := string(p.Status.Phase)
			if p.Status.Reason != "" {
				end += " (" + p.Status.Reason + ")"
			}
			if p.DeletionTimestamp != nil {
				end += " deleting"
			}
			if len(podEnd) == 0 || podEnd[len(podEnd)-1] != end {
				podEnd = append(podEnd, end)
			}
		}
		now, pending := time.Now(), 0
		for _, s := range sessions {
			if s.gone.IsZero() && !left[s.id] {
				if now.Before(s.deadline) {
					b.Fatalf("session %s lost its objects %s before its deadline with labkeep stopped", s.id, s.deadline.Sub(now))
				}
				s.gone = now
			}
			if s.gone.IsZero() {
				pending++
			}
		}
		if pending == 0 {
			break
		}
		if now.After(bound) {
			b.Fatalf("%d sessions still have objects 3 min after their deadline: %v", pending, d.Objects(""))
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, s := range sessions {
		if got := d.Count("SELECT count(*) FROM sessions WHERE id = $1 AND status = 'running'", s.id); got != 1 {
			b.Errorf("session %s's row is no longer running: something of labkeep ran after %s", s.id, stopped)
		}
		if s.pod {
			pod = append(pod, s.gone.Sub(s.deadline))
		} else {
			vm = append(vm, s.gone.Sub(s.deadline))
		}
	}
	if _, err := d.Kube.BatchV1().Jobs(d.Namespace).Get(context.Background(), session.AnchorName(ws.id), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		b.Errorf("the anchor Job of %s: %v, want it gone", ws.id, err)
	}
	return vm, pod, "the Pod went " + strings.Join(podEnd, " → ")
}

// failsafePod reads the named Pod in d's sessions namespace, nil once it is
// gone.
func failsafePod(b *testing.B, d *stacktest.Deployment, name string) *corev1.Pod {
	b.Helper()
	p, err := d.Kube.CoreV1().Pods(d.Namespace).Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// failsafeRounded rounds each duration to 100 ms for the note.
func failsafeRounded(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(100 * time.Millisecond)
	}
	return out
}
