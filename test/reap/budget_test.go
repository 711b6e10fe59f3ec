package reap_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"labkeep/localrun/stacktest"
	"labkeep/shared/kube"
	"labkeep/shared/reap"
)

// slowDeletes delays every DELETE by d before sending it: the reaper's
// client talks to an API server that takes d per delete (a slow admission
// webhook, an overloaded etcd). Nothing else is slowed.
type slowDeletes struct {
	next http.RoundTripper
	d    time.Duration
}

func (s slowDeletes) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodDelete {
		select {
		case <-time.After(s.d):
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
	}
	return s.next.RoundTrip(req)
}

// BenchmarkGetSessionWhileReaping: 100 sessions expire at once and the
// reaper's every delete takes 2 s; meanwhile 16 students poll getSession
// over HTTP on a main database pool of 4 connections (pgxpool's default on
// a small Pod). Reported: getSession p50/p99 during the run (target p99 <
// 200 ms), the run's duration and how many sessions it reaped. "reaper on
// the main pool" is how the reaper was wired before it had a pool of its
// own, for comparison. Run with -benchtime=1x: each iteration opens 100
// sessions.
func BenchmarkGetSessionWhileReaping(b *testing.B) {
	for _, tc := range []struct {
		name       string
		sharedPool bool
	}{{"reaper pool of its own", false}, {"reaper on the main pool", true}} {
		b.Run(tc.name, func(b *testing.B) {
			for range b.N {
				benchReapingUnderLoad(b, tc.sharedPool)
			}
		})
	}
}

func benchReapingUnderLoad(b *testing.B, sharedPool bool) {
	b.StopTimer()
	const sessions, pollers, deleteDelay = 100, 16, 2 * time.Second
	d := stacktest.Deploy(b, st, stacktest.Options{MaxVMs: 1000, KubeQPS: 500, KubeBurst: 1000, DBConns: 4, Log: stacktest.Discard()})
	ctx := context.Background()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	students := make([]string, sessions)
	for i := range sessions {
		students[i] = fmt.Sprintf("s-%03d", i)
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if _, err := d.App.Sessions.Open(ctx, students[i], "linux-vm", ""); err != nil {
				b.Errorf("open %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	d.Clock.Advance(61 * time.Minute)
	tokens := make([]string, pollers)
	for i := range tokens {
		tokens[i] = d.Token(students[i*sessions/pollers], "student")
	}

	kcfg := d.App.Config.Kube // as Build resolved it
	rc := rest.CopyConfig(d.App.Kube)
	rc.Wrap(func(next http.RoundTripper) http.RoundTripper { return slowDeletes{next: next, d: deleteDelay} })
	slow, err := kube.NewForConfig(kcfg, rc)
	if err != nil {
		b.Fatal(err)
	}
	reaper := *d.App.Reaper
	reaper.Cluster = slow
	if sharedPool {
		reaper.Store = d.App.Store
	}

	done := make(chan struct{})
	var mu sync.Mutex
	var latencies []time.Duration
	var failures int
	var pw sync.WaitGroup
	for _, tok := range tokens {
		pw.Add(1)
		go func() {
			defer pw.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				req, _ := http.NewRequest(http.MethodGet, d.Server.URL+"/getSession", nil)
				req.Header.Set("Authorization", "Bearer "+tok)
				start := time.Now()
				resp, err := http.DefaultClient.Do(req)
				took := time.Since(start)
				mu.Lock()
				if err != nil || resp.StatusCode != http.StatusOK {
					failures++
				} else {
					latencies = append(latencies, took)
				}
				mu.Unlock()
				if err == nil {
					resp.Body.Close()
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	b.StartTimer()
	start := time.Now()
	rep, err := reaper.RunOnce(ctx, reap.TriggerSchedule)
	took := time.Since(start)
	b.StopTimer()
	close(done)
	pw.Wait()
	if err != nil {
		b.Fatal(err)
	}
	if failures > 0 || len(latencies) == 0 {
		b.Fatalf("%d getSession calls failed, %d succeeded", failures, len(latencies))
	}
	slices.Sort(latencies)
	pct := func(p float64) float64 {
		return float64(latencies[int(p*float64(len(latencies)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "getSession-p50-ms")
	b.ReportMetric(pct(0.99), "getSession-p99-ms")
	b.ReportMetric(float64(len(latencies)), "getSession-calls")
	b.ReportMetric(took.Seconds(), "run-s")
	b.ReportMetric(float64(rep.Counts[reap.Expired]), "reaped")
	b.Logf("%s: run %s reaped %d of %d (failures %d); getSession p50 %.1f ms p99 %.1f ms over %d calls",
		map[bool]string{true: "reaper on the main pool", false: "reaper pool of its own"}[sharedPool],
		took.Round(time.Millisecond), rep.Counts[reap.Expired], sessions, len(rep.Failures), pct(0.5), pct(0.99), len(latencies))
}
