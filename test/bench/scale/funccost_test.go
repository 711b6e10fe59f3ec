package scale_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"labkeep/localrun/benchtable"
	"labkeep/localrun/stacktest"
)

// BenchmarkTableFunctionsCost: n students, each with a running session,
// call getSession (then extendSession) back to back over loopback HTTP for
// a fixed window: a closed-loop load of n requests in flight, never more.
// Measured per endpoint: answer time p50/p99, requests per second, and
// heap allocations per request (the whole test process's, load generator
// included, so only the difference to the baseline is the functions'). The
// baseline is the floor of the same path: a bare net/http handler on the
// same loopback, under the same load from the same client, answering a
// fixed JSON body of the size the endpoint answered — what serving the
// request costs before labkeep authenticates, reads its row or asks the
// API server anything.
func BenchmarkTableFunctionsCost(b *testing.B) {
	students, window := 200, 10*time.Second
	if benchtable.Quick() {
		students, window = 20, 2*time.Second
	}
	d := stacktest.Deploy(b, st, stacktest.Options{MaxVMs: 1000, KubeQPS: 500, KubeBurst: 1000, Log: stacktest.Discard()})
	names := openLive(b, d, 0, students)
	tokens := make([]string, len(names))
	for i, s := range names {
		tokens[i] = d.Token(s, "student")
	}
	for range b.N {
		for _, ep := range []struct{ method, path string }{{http.MethodGet, "/getSession"}, {http.MethodPost, "/extendSession"}} {
			fn := loadFor(b, d.URL, ep.method, ep.path, tokens, window)
			floor := loadFor(b, floorServer(b, fn.body), ep.method, ep.path, tokens, window)
			recordFunctionsCost(b, ep.path, students, window, fn, floor)
		}
	}
}

// floorServer serves body as JSON for every request: the baseline.
func floorServer(b *testing.B, body []byte) string {
	b.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	b.Cleanup(srv.Close)
	return srv.URL
}

// loadResult is what one window of load measured.
type loadResult struct {
	answers       []time.Duration
	perSecond     float64
	allocsPerReq  float64
	bytesPerReq   float64
	body          []byte // one 200 answer's body
	failed        int
	firstFailure  string
	requests      int
	windowElapsed time.Duration
}

// loadFor has one goroutine per token send method path to url back to back
// until window has passed, and measures the answers and the process's heap
// allocations over the window.
func loadFor(b *testing.B, url, method, path string, tokens []string, window time.Duration) loadResult {
	b.Helper()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: len(tokens)}, Timeout: time.Minute}
	defer client.CloseIdleConnections()
	var res loadResult
	var mu sync.Mutex
	var wg sync.WaitGroup
	var keepBody sync.Once
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	deadline := start.Add(window)
	for _, tok := range tokens {
		wg.Go(func() {
			var mine []time.Duration
			for time.Now().Before(deadline) {
				req, err := http.NewRequest(method, url+path, nil)
				if err != nil {
					b.Error(err)
					return
				}
				req.Header.Set("Authorization", "Bearer "+tok)
				t0 := time.Now()
				resp, err := client.Do(req)
				var body []byte
				if err == nil {
					body, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				took := time.Since(t0)
				if err != nil || resp.StatusCode != http.StatusOK {
					mu.Lock()
					res.failed++
					if res.firstFailure == "" {
						res.firstFailure = fmt.Sprintf("%v %s", err, body)
						if err == nil {
							res.firstFailure = fmt.Sprintf("%d %s", resp.StatusCode, body)
						}
					}
					mu.Unlock()
					continue
				}
				mine = append(mine, took)
				keepBody.Do(func() { res.body = body })
			}
			mu.Lock()
			res.answers = append(res.answers, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	res.windowElapsed = time.Since(start)
	runtime.ReadMemStats(&after)
	res.requests = len(res.answers) + res.failed
	if res.failed > 0 || len(res.answers) == 0 {
		b.Fatalf("%s %s: %d of %d requests failed, e.g. %s", method, url+path, res.failed, res.requests, res.firstFailure)
	}
	res.perSecond = float64(res.requests) / res.windowElapsed.Seconds()
	res.allocsPerReq = float64(after.Mallocs-before.Mallocs) / float64(res.requests)
	res.bytesPerReq = float64(after.TotalAlloc-before.TotalAlloc) / float64(res.requests)
	return res
}

func recordFunctionsCost(b *testing.B, path string, students int, window time.Duration, fn, floor loadResult) {
	b.Helper()
	name := strings.TrimPrefix(path, "/")
	c := fmt.Sprintf("%d students in flight, %s window", students, window)
	baseline := fmt.Sprintf("bare net/http handler, same loopback and load, fixed %d-byte JSON body", len(fn.body))
	note := fmt.Sprintf("%d requests (floor: %d); allocations are the whole process's", fn.requests, floor.requests)
	for _, f := range []struct {
		figure string
		v, bv  float64
		unit   string
	}{
		{name + " p50", ms(benchtable.Quantile(fn.answers, 0.5)), ms(benchtable.Quantile(floor.answers, 0.5)), "ms"},
		{name + " p99", ms(benchtable.Quantile(fn.answers, 0.99)), ms(benchtable.Quantile(floor.answers, 0.99)), "ms"},
		{name + " throughput", fn.perSecond, floor.perSecond, "req/s"},
		{name + " allocations per request", fn.allocsPerReq, floor.allocsPerReq, "allocs"},
		{name + " heap bytes per request", fn.bytesPerReq / 1024, floor.bytesPerReq / 1024, "KiB"},
	} {
		benchtable.Record(b, benchtable.Row{
			Group: "Functions' own cost", Case: c, Figure: f.figure, Value: f.v, Unit: f.unit,
			Baseline: baseline, BaselineValue: benchtable.F(f.bv), Note: note,
		})
	}
}
