package scale_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"labkeep/localrun/benchtable"
	"labkeep/localrun/stacktest"
	"labkeep/shared/httpapi"
	"labkeep/shared/labs"
	"labkeep/shared/line"
	"labkeep/shared/seating"
	"labkeep/shared/session"
)

// burstCapacity is LABKEEP_MAX_CONCURRENT_VMS in the burst: the default.
const burstCapacity = 8

// BenchmarkTableOpenBurst: n students press "open" on a one-VM lab at the
// same instant against a capacity of 8 VMs, over HTTP. Measured: the
// openSession answer time (the objects created, not the VM booted: that is
// virtsim's delay, not labkeep's), how far the live VMs ever went beyond
// the capacity (sampled from the API server every few milliseconds
// throughout the burst) and what is left once every student closed. The
// baseline is the same functions in the same run, on the same API server
// and database, with the capacity lock taken out: each open counts the
// live VMs, then creates, which is how a check-then-create without the
// lock overshoots. No ResourceQuota is applied, so only the lock bounds
// the VMs.
func BenchmarkTableOpenBurst(b *testing.B) {
	sizes := []int{10, 50, 200}
	if benchtable.Quick() {
		sizes = []int{10}
	}
	d := stacktest.Deploy(b, st, stacktest.Options{MaxVMs: burstCapacity, Log: stacktest.Discard()})
	unlocked := unlockedServer(b, d)
	for range b.N {
		for _, n := range sizes {
			locked := openBurst(b, d, d.URL, "lock", n)
			base := openBurst(b, d, unlocked, "nolock", n)
			recordBurst(b, n, locked, base)
		}
	}
}

// unlockedServer serves the deployment's session functions over HTTP with
// one difference: the capacity lock is a no-op, so an open counts the live
// VMs and creates without excluding other opens (the baseline).
func unlockedServer(b *testing.B, d *stacktest.Deployment) string {
	b.Helper()
	auth, err := d.App.Config.Tokens.Authenticator([]byte(stacktest.JWTSecret), d.Clock.Now)
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.New(httpapi.Options{Sessions: unlocked(d), Auth: auth, Now: d.Clock.Now, Log: stacktest.Discard()}))
	b.Cleanup(srv.Close)
	return srv.URL
}

// unlocked is the deployment's session service with a capacity lock that
// excludes nothing: every open counts the live VMs and creates at once.
// Each call gets an Usher of its own, as if every request ran in a
// process of its own (as on Lambda), so opens do not take turns within
// the process either.
func unlocked(d *stacktest.Deployment) *session.Service {
	svc := *d.App.Sessions
	svc.Seating = perCall{seating.Config{
		Rows: svc.Starter, Store: noCapacityLock{d.App.Store}, Cluster: d.App.Cluster, Labs: d.App.Labs,
		Limits: d.App.Config.Limits, Waitlist: d.App.Store, Now: d.Clock.Now, Log: stacktest.Discard(),
	}}
	return &svc
}

// perCall is a Seating that builds a new Usher from its configuration
// for every call.
type perCall struct{ cfg seating.Config }

func (p perCall) Seat(ctx context.Context, sess session.Session, lab labs.Lab, wait bool) (bool, session.Standing, error) {
	return seating.NewUsher(p.cfg).Seat(ctx, sess, lab, wait)
}

func (p perCall) Queued(ctx context.Context, student string) (line.Waiting, error) {
	return seating.NewUsher(p.cfg).Queued(ctx, student)
}

func (p perCall) Leave(ctx context.Context, student, id string, actor session.Actor, by string) (session.Session, error) {
	return seating.NewUsher(p.cfg).Leave(ctx, student, id, actor, by)
}

func (p perCall) Freed(ctx context.Context) { seating.NewUsher(p.cfg).Freed(ctx) }

// noCapacityLock is the store with LockCapacity taking no lock: the
// baseline's check-then-create.
type noCapacityLock struct{ seating.Store }

func (noCapacityLock) LockCapacity(context.Context) (func(), error) { return func() {}, nil }

// burstResult is what one burst measured.
type burstResult struct {
	answers []time.Duration
	// admittedAnswers and refusedAnswers are answers split by outcome.
	admittedAnswers, refusedAnswers []time.Duration
	created, refused                int
	other                           []string // answers neither 201 nor 503 no_capacity
	maxVMs, leftovers               int
}

// openBurst has n students open linux-vm at once through the functions at
// url, samples the namespace's VMs throughout, then closes every opened
// session through the deployment and waits for the namespace and the live
// rows to empty (leftovers: what is still there after two minutes).
func openBurst(b *testing.B, d *stacktest.Deployment, url, tag string, n int) burstResult {
	b.Helper()
	prefix := fmt.Sprintf("burst-%s-%d-%s", tag, n, stacktest.Suffix())
	tokens := make([]string, n)
	for i := range tokens {
		tokens[i] = d.Token(fmt.Sprintf("%s-%d", prefix, i), "student")
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}, Timeout: 5 * time.Minute}
	defer client.CloseIdleConnections()

	var res burstResult
	sampled := make(chan int)
	stop := make(chan struct{})
	go func() {
		most := 0
		for {
			most = max(most, countVMs(b, d))
			select {
			case <-stop:
				sampled <- max(most, countVMs(b, d))
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()

	var mu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	opened := make([]bool, n)
	for i, tok := range tokens {
		wg.Go(func() {
			<-start
			t0 := time.Now()
			status, body, err := post(client, url+"/openSession", tok, `{"lab":"linux-vm"}`)
			took := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				res.other = append(res.other, err.Error())
				return
			case status == http.StatusCreated:
				res.created++
				opened[i] = true
				res.admittedAnswers = append(res.admittedAnswers, took)
			case status == http.StatusServiceUnavailable && strings.Contains(body, `"no_capacity"`):
				res.refused++
				res.refusedAnswers = append(res.refusedAnswers, took)
			default:
				res.other = append(res.other, fmt.Sprintf("%d %s", status, body))
			}
			res.answers = append(res.answers, took)
		})
	}
	close(start)
	wg.Wait()
	close(stop)
	res.maxVMs = <-sampled
	if len(res.other) > 0 {
		b.Fatalf("%s burst of %d: %d answers neither 201 nor 503 no_capacity, e.g. %s", tag, n, len(res.other), res.other[0])
	}

	sem := make(chan struct{}, 8)
	for i, ok := range opened {
		if !ok {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if status, body, err := post(client, d.URL+"/closeSession", tokens[i], ""); err != nil || status != http.StatusOK {
				b.Errorf("close %s-%d: %d %s %v", prefix, i, status, body, err)
			}
		})
	}
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_ = stacktest.Until(ctx, func() (bool, string) {
		res.leftovers = len(d.Objects("")) + len(d.LiveIDs())
		return res.leftovers == 0, ""
	})
	return res
}

// countVMs counts the namespace's VirtualMachines as the capacity check
// does: every one, deleting or not.
func countVMs(b *testing.B, d *stacktest.Deployment) int {
	list, err := d.Dyn.Resource(stacktest.Resource("VirtualMachine")).Namespace(d.Namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		b.Errorf("list VMs: %v", err)
		return 0
	}
	return len(list.Items)
}

// post sends one authenticated POST and returns the status and body.
func post(c *http.Client, url, token, body string) (int, string, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	got, err := io.ReadAll(res.Body)
	return res.StatusCode, string(got), err
}

func recordBurst(b *testing.B, n int, locked, base burstResult) {
	b.Helper()
	c := fmt.Sprintf("%d students at once, capacity %d", n, burstCapacity)
	const baseline = "the same opens without the capacity lock (count live VMs, then create), same run"
	note := fmt.Sprintf("lock: %d opened, %d refused; without: %d opened, %d refused", locked.created, locked.refused, base.created, base.refused)
	for _, f := range []struct {
		figure    string
		v, bv     float64
		unit, why string
	}{
		{figure: "openSession answer p50", v: ms(benchtable.Quantile(locked.answers, 0.5)), bv: ms(benchtable.Quantile(base.answers, 0.5)), unit: "ms"},
		{figure: "openSession answer p99", v: ms(benchtable.Quantile(locked.answers, 0.99)), bv: ms(benchtable.Quantile(base.answers, 0.99)), unit: "ms"},
		{figure: "admitted opens' answer p99", v: ms(benchtable.Quantile(locked.admittedAnswers, 0.99)), bv: ms(benchtable.Quantile(base.admittedAnswers, 0.99)), unit: "ms"},
		{figure: "overshoot (max live VMs sampled − capacity)", v: float64(max(0, locked.maxVMs-burstCapacity)), bv: float64(max(0, base.maxVMs-burstCapacity)), unit: "VMs"},
		{figure: "leftovers after every student closed (objects + live rows)", v: float64(locked.leftovers), bv: float64(base.leftovers), unit: "count"},
	} {
		benchtable.Record(b, benchtable.Row{
			Group: "Open burst", Case: c, Figure: f.figure, Value: f.v, Unit: f.unit,
			Baseline: baseline, BaselineValue: benchtable.F(f.bv), Note: note,
		})
	}
	if len(locked.refusedAnswers) > 0 {
		benchtable.Record(b, benchtable.Row{
			Group: "Open burst", Case: c, Figure: "refused opens' answer p99", Value: ms(benchtable.Quantile(locked.refusedAnswers, 0.99)), Unit: "ms",
			Baseline: baseline, Why: "without the lock nobody is refused", Note: note + "; a refusal is meant to answer within 100 ms",
		})
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

var _ session.Seating = perCall{}
