package podlab_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"labkeep/localrun/benchtable"
	"labkeep/localrun/stacktest"
)

// How soon the node's NetworkPolicy engine confines a new session's
// workspace Pod, against when that Pod answers at all. Both are timed from
// the moment the API server shows the Pod's address: "confined" when the
// engine has put the address under its firewall chain (the session's
// policy exists before the Pod, so that first sync carries it), "answers"
// when guardian's port accepts a connection from the host, which needs no
// policy. A confinement later than the answer is a window in which the
// Pod was reachable unconfined.
func BenchmarkTablePolicyEnforcement(b *testing.B) {
	samples := 20
	if benchtable.Quick() {
		samples = 2
	}
	d := stacktest.Deploy(b, st, stacktest.Options{Log: stacktest.Discard()})
	for range b.N {
		var confined, answers []time.Duration
		for i := range samples {
			c, a := confinement(b, d, fmt.Sprintf("np-%d", i))
			confined, answers = append(confined, c), append(answers, a)
		}
		for _, q := range []struct {
			name string
			q    float64
		}{{"p50", 0.5}, {"p99", 0.99}} {
			c, a := benchtable.Quantile(confined, q.q), benchtable.Quantile(answers, q.q)
			b.ReportMetric(float64(c.Milliseconds()), "confined-"+q.name+"-ms")
			benchtable.Record(b, benchtable.Row{
				Group: "Network policy", Case: fmt.Sprintf("%d shell sessions, one at a time, kube-router's controller on the real node", samples),
				Figure: "Pod has an address → in its policy's chain (" + q.name + ")",
				Value:  float64(c.Milliseconds()), Unit: "ms",
				Baseline: "the same Pods: address → guardian's port answers (no policy needed)", BaselineValue: benchtable.F(float64(a.Milliseconds())),
				Note: fmt.Sprintf("confined %v; answers %v", confined, answers),
			})
		}
	}
}

// confinement opens the shell lab for name and returns, from the moment
// the API server shows its workspace Pod's address, how long until the
// engine confines that address and until guardian's port answers the host.
// The session is closed and its objects gone before it returns.
func confinement(b *testing.B, d *stacktest.Deployment, name string) (confined, answers time.Duration) {
	b.Helper()
	ctx := context.Background()
	s := openLab(b, d, name, "shell", nil)
	var ip string
	var addressed time.Time
	for deadline := time.Now().Add(3 * time.Minute); confined == 0 || answers == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("session %s: address %q, confined after %v, answers after %v: not both within 3 min", s.opened.ID, ip, confined, answers)
		}
		if ip == "" {
			p, err := d.Kube.CoreV1().Pods(d.Namespace).Get(ctx, s.podName(), metav1.GetOptions{})
			if err == nil && p.Status.PodIP != "" {
				ip, addressed = p.Status.PodIP, time.Now()
			}
			continue
		}
		if confined == 0 {
			ok, err := st.Node.Confines(ip)
			if err != nil {
				b.Fatal(err)
			}
			if ok {
				confined = time.Since(addressed)
			}
		}
		if answers == 0 {
			if c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, "9090"), 100*time.Millisecond); err == nil {
				c.Close()
				answers = time.Since(addressed)
			}
		}
	}
	s.close()
	d.WaitGone(s.opened.ID)
	return confined, answers
}
